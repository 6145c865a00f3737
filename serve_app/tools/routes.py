"""The agent tools: ``GET /tools`` lists them in the shape a caller loads (``format=openai``
function-calling tools, ``openai-strict`` the same in OpenAI's strict subset, ``mcp`` the MCP
tool list, ``router`` DAGI-Router entries, or the gateway's own listing), and
``POST /tools/{function}`` runs one with an LLM's arguments as the body — the endpoint router
entries point at. Tenancy comes from the credential and the router's headers
(serve_app/tools/tenancy.py), never from the arguments."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import PlainTextResponse

from serve_app.http.deps import Caller
from serve_app.ops.surface import catalog_access
from serve_app.tools.catalog import gateway_tools, mcp_tools, openai_tools, router_listing
from serve_app.tools.runner import ToolRunner

router = APIRouter(tags=["tools"])


@router.get("/tools", dependencies=[Depends(catalog_access)])
async def tools(
    request: Request,
    format: Literal["gateway", "openai", "openai-strict", "mcp", "router"] = Query(
        "gateway",
        description="The shape of the listing; openai-strict: OpenAI function tools in the "
        "strict subset (every property required, optional ones nullable; strict: true).",
    ),
) -> dict[str, Any]:
    """The four tools with their argument schemas, in the shape ``format`` names; every bound
    is the one this server enforces (its settings)."""
    settings = request.app.state.shared.settings
    if format in ("openai", "openai-strict"):
        return {"tools": openai_tools(settings, strict=format == "openai-strict")}
    if format == "mcp":
        return {"tools": mcp_tools(settings)}
    if format == "router":
        return router_listing(str(request.base_url), settings)
    return {"tools": gateway_tools(settings)}


@router.post("/tools/{function}", response_model=None)
async def call_tool(
    function: str,
    request: Request,
    caller: Caller,
    arguments: Annotated[dict[str, Any] | None, Body()] = None,
) -> dict[str, Any] | PlainTextResponse:
    """Run a tool (``rag_search_docs``, ``rag_enrich_answer``, ``graph_query_context``,
    ``graph_explain_path``) with the LLM's arguments as the JSON body. ``X-Team-Id`` names
    the team when the credential grants several; ``X-Rag-Visibility: confidential`` widens to
    confidential documents where the credential allows it. ``format: "text"`` answers
    ``text/plain``."""
    runner: ToolRunner = request.app.state.services.tools
    result = await runner.call(function, arguments, caller, request.headers)
    if result.text is not None:
        return PlainTextResponse(result.text)
    return result.response.model_dump(mode="json", exclude_none=True, by_alias=True)
