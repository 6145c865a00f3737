"""The four agent tools, one ``ToolSpec`` each: the source every face is generated from —
``GET /tools`` (the gateway's own listing, OpenAI function-calling tools, the MCP tool list,
DAGI-Router entries), ``POST /tools/{function}`` and the MCP server. Nothing here is copied
by hand into another shape: the schemas are the argument models' own."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from deployments.validation import plain_schema
from serve_app.enrich.contracts import EnrichAnswerRequest, EnrichAnswerResponse
from serve_app.graph.contracts import (
    ExplainPathRequest,
    ExplainPathResponse,
    GraphQueryRequest,
    GraphQueryResponse,
)
from serve_app.request import RequestContext
from serve_app.search.contracts import SearchDocsRequest, SearchDocsResponse
from serve_app.settings import GatewaySettings
from serve_app.tools.args import EnrichAnswerArgs, ExplainPathArgs, GraphQueryArgs, SearchDocsArgs
from serve_app.tools.bounds import apply, request_bounds, tool_bounds
from serve_app.tools.strict import strict_parameters
from serve_app.tools.tenancy import ToolTenancy

# The function-name rule of OpenAI, Anthropic and Gemini tool calling.
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_ROUTE = "/tools/{function}"


def _with_filters(args: BaseModel) -> dict[str, Any]:
    assert isinstance(args, SearchDocsArgs | EnrichAnswerArgs)
    body = args.model_dump(exclude={"format", "filters"})
    body["filters"] = args.filters.search_filters()
    return body


def _graph(args: BaseModel) -> dict[str, Any]:
    body = args.model_dump(exclude={"format"}, exclude_none=True)
    return {k: v for k, v in body.items() if v != {}}


def _path(args: BaseModel) -> dict[str, Any]:
    assert isinstance(args, ExplainPathArgs)
    return {
        "from": args.source,
        "to": args.target,
        "max_hops": args.max_hops,
        "max_paths": args.max_paths,
    }


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its dotted name (the specification's), the function name tool-calling APIs
    accept, the HTTP route of the full request, the arguments an LLM fills, the full request
    they complete into, and the response."""

    name: str
    route: str
    args: type[BaseModel]
    request: type[BaseModel]
    response: type[BaseModel]
    # The argument fields of the full request (tenancy is added by ``build``).
    _fields: Callable[[BaseModel], dict[str, Any]]
    # The service call of the HTTP route: (the ToolRunner holding the services, full
    # request, caller).
    call: Callable[[Any, Any, RequestContext], Awaitable[BaseModel]]

    @property
    def function(self) -> str:
        return self.name.replace(".", "_")

    @property
    def endpoint(self) -> str:
        """Where a router posts the LLM's arguments."""
        return TOOL_ROUTE.format(function=self.function)

    @property
    def description(self) -> str:
        return " ".join((self.args.__doc__ or self.name).split())

    def parameters(self, settings: GatewaySettings | None = None) -> dict[str, Any]:
        """The argument model's JSON schema, references inlined and titles dropped (the
        plain shape every function-calling API accepts); with ``settings``, the bounds the
        server enforces from them (serve_app/tools/bounds.py) instead of the model's."""
        schema = plain_schema(self.args.model_json_schema(by_alias=True))
        schema.pop("description", None)  # the tool's own description says it
        if settings is not None:
            apply(schema, tool_bounds(settings).get(self.function, {}))
        return schema

    def request_schema(self, settings: GatewaySettings | None = None) -> dict[str, Any]:
        """The full request's JSON schema, with the configured bounds when given."""
        schema = self.request.model_json_schema()
        if settings is not None:
            apply(schema, request_bounds(settings).get(self.request.__name__, {}))
        return schema

    def build(self, args: BaseModel, tenancy: ToolTenancy) -> BaseModel:
        """The full HTTP request of these arguments, for the caller's team and mode.

        Raises:
            pydantic.ValidationError: the arguments break a rule of the full request.
        """
        body = self._fields(args)
        body.update(team_id=tenancy.team_id, visibility=tenancy.visibility)
        return self.request.model_validate(body)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "rag.search_docs",
        "/rag/search_docs",
        SearchDocsArgs,
        SearchDocsRequest,
        SearchDocsResponse,
        _with_filters,
        lambda s, request, rc: s.search.search_docs(request, rc),
    ),
    ToolSpec(
        "rag.enrich_answer",
        "/rag/enrich_answer",
        EnrichAnswerArgs,
        EnrichAnswerRequest,
        EnrichAnswerResponse,
        _with_filters,
        lambda s, request, rc: s.enrich.enrich_answer(request, rc),
    ),
    ToolSpec(
        "graph.query_context",
        "/graph/query",
        GraphQueryArgs,
        GraphQueryRequest,
        GraphQueryResponse,
        _graph,
        lambda s, request, rc: s.graph.graph_query(request, rc),
    ),
    ToolSpec(
        "graph.explain_path",
        "/graph/explain_path",
        ExplainPathArgs,
        ExplainPathRequest,
        ExplainPathResponse,
        _path,
        lambda s, request, rc: s.graph.explain_path(request, rc),
    ),
)
BY_FUNCTION = {t.function: t for t in TOOLS} | {t.name: t for t in TOOLS}


def openai_tools(
    settings: GatewaySettings | None = None, *, strict: bool = False
) -> list[dict[str, Any]]:
    """Chat Completions ``tools``: ``{"type": "function", "function": {name, description,
    parameters}}``. Every listing takes the settings the server enforces its bounds from;
    ``strict`` gives the schemas in OpenAI's strict subset (serve_app/tools/strict.py) and
    marks each function ``strict: true``."""
    out = []
    for t in TOOLS:
        function: dict[str, Any] = {"name": t.function, "description": t.description}
        if strict:
            function["parameters"] = strict_parameters(t.function, t.parameters(settings))
            function["strict"] = True
        else:
            function["parameters"] = t.parameters(settings)
        out.append({"type": "function", "function": function})
    return out


def mcp_tools(settings: GatewaySettings | None = None) -> list[dict[str, Any]]:
    """The MCP ``tools/list`` entries: name, description, inputSchema, outputSchema."""
    return [
        {
            "name": t.function,
            "title": t.name,
            "description": t.description,
            "inputSchema": t.parameters(settings),
            "outputSchema": plain_schema(t.response.model_json_schema(mode="serialization")),
        }
        for t in TOOLS
    ]


# The provider id and timeout of the DAGI-Router entries (docs/router-config.example.yml).
ROUTER_PROVIDER = "rag-gateway"
ROUTER_TIMEOUT_MS = 10_000


def router_entries(base_url: str) -> list[dict[str, Any]]:
    """DAGI-Router tool entries (``agents.<id>.tools``) in the shape its loader reads:
    ``{id, type: external, endpoint, description}``. A tool entry has no provider key there,
    so ``endpoint`` is the absolute URL under ``base_url``."""
    base = base_url.rstrip("/")
    return [
        {
            "id": t.name,
            "type": "external",
            "endpoint": f"{base}{t.endpoint}",
            "description": t.description,
        }
        for t in TOOLS
    ]


def router_listing(base_url: str, settings: GatewaySettings | None = None) -> dict[str, Any]:
    """``GET /tools?format=router``: the blocks to merge into a DAGI router-config.yml — the
    provider entry (``orchestrator_providers``) and the tool entries — plus, outside the
    config, each tool's argument schema for the router's function-calling LLM."""
    base = base_url.rstrip("/")
    return {
        "orchestrator_providers": {
            ROUTER_PROVIDER: {
                "type": "http",
                "description": "RAG gateway: document search, cited answers, knowledge graph",
                "base_url": base,
                "timeout_ms": ROUTER_TIMEOUT_MS,
                "health": "/readyz",
            }
        },
        "tools": router_entries(base),
        "parameters": {t.name: t.parameters(settings) for t in TOOLS},
    }


def gateway_tools(settings: GatewaySettings | None = None) -> list[dict[str, Any]]:
    """The gateway's own listing: both names, both routes, arguments, the full request and
    the response schema."""
    return [
        {
            "name": t.name,
            "function": t.function,
            # The full HTTP request (team_id in the body) and the tool call (arguments only).
            "endpoint": f"POST {t.route}",
            "tool_endpoint": f"POST {t.endpoint}",
            "description": t.description,
            "arguments": t.parameters(settings),
            "input_schema": t.request_schema(settings),
            "output_schema": t.response.model_json_schema(),
            "auth": "Authorization: Bearer <JWT or API key>",
        }
        for t in TOOLS
    ]
