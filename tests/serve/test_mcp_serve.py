"""The MCP server at /mcp of the real Serve app (the suite's cluster, real backends), driven by
the SDK's client over Streamable HTTP through Serve's proxy: the catalog's tools, each of the
four called, tool errors, authentication before the MCP layer.

The suite's app runs in ``auth.mode=dev`` (tests/serve/conftest.py): a request without a
credential is a development caller trusted in the team it names (X-Team-Id here), so the
401 is a credential that does not verify. A credential sent is verified all the same: the
suite's API key (one team) shows the team coming from the credential and another team
forbidden; tests/unit/serve_app/tools/test_mcp.py covers the same with JWTs."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from serve_app.settings import GatewaySettings
from serve_app.tools.catalog import TOOLS, mcp_tools

pytestmark = pytest.mark.serve

MODES = ["legacy", "auto"]


@pytest.fixture(scope="module")
def team(client: httpx.Client) -> str:
    """A fresh tenant with two documents, a project using Milvus, and a second tenant."""
    a, b = f"dao_mcp_{uuid.uuid4().hex[:6]}", f"dao_mcpb_{uuid.uuid4().hex[:6]}"
    docs = [
        {
            "team_id": a,
            "doc_id": "wiki/vector-search.md",
            "title": "Vector search",
            "text": "# Vector search\n\nThe gateway runs hybrid retrieval on Milvus for agents.",
            "project_id": "prj_x",
            "doc_type": "wiki",
            "tags": ["milvus"],
            "author_id": "olena",
        },
        {
            "team_id": a,
            "doc_id": "solar",
            "title": "Solar microgrid",
            "text": "Solar panels and batteries power the community microgrid.",
            "doc_type": "doc",
        },
        {
            "team_id": b,
            "doc_id": "b_milvus",
            "title": "Other team Milvus notes",
            "text": "Team B evaluates Milvus as a vector database for hybrid retrieval.",
            "doc_type": "wiki",
        },
    ]
    r = client.post("/ingest/documents", json={"documents": docs})
    assert r.status_code == 200 and r.json()["indexed"] == 3, r.text
    entities = {
        "team_id": a,
        "nodes": [{"label": "Resource", "id": "milvus", "name": "Milvus"}],
        "relationships": [
            {
                "type": "USES",
                "from": {"label": "Project", "id": "prj_x"},
                "to": {"label": "Resource", "id": "milvus"},
            }
        ],
    }
    r = client.post("/graph/entities", json=entities)
    assert r.status_code == 200, r.text
    return a


@asynccontextmanager
async def mcp(gateway: str, mode: str = "auto", **headers: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120.0))
    transport = streamable_http_client(f"{gateway}/mcp", http_client=http)
    async with http, Client(transport, mode=mode) as client:
        yield client


def answer_of(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    return result.structured_content


def error_of(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    return json.loads(result.content[0].text)


@pytest.mark.parametrize("mode", MODES)
async def test_lists_the_catalog_and_searches_inside_the_team(gateway: str, team: str, mode):
    async with mcp(gateway, mode, **{"X-Team-Id": team}) as client:
        listed = (await client.list_tools()).tools
        result = await client.call_tool("rag_search_docs", {"query": "Milvus hybrid retrieval"})
    assert [t.name for t in listed] == [t.function for t in TOOLS]
    # With the bounds the server enforces (the ones serve_config.yaml sets do not reach these).
    for tool, entry in zip(listed, mcp_tools(GatewaySettings()), strict=True):
        assert tool.input_schema == entry["inputSchema"]
        assert tool.output_schema == entry["outputSchema"]
    body = answer_of(result)
    assert body["matches"][0]["source_ref"]["id"] == "wiki/vector-search.md"
    assert {m["source_ref"]["team_id"] for m in body["matches"]} == {team}
    assert json.loads(result.content[0].text) == body


async def test_each_tool_answers_through_serve(gateway: str, team: str):
    async with mcp(gateway, **{"X-Team-Id": team}) as client:
        text = await client.call_tool(
            "rag_search_docs", {"query": "solar batteries", "top_k": 1, "format": "text"}
        )
        enriched = await client.call_tool(
            "rag_enrich_answer",
            {"draft_answer": "The gateway runs hybrid retrieval on Milvus for agents."},
        )
        projects = await client.call_tool(
            "graph_query_context",
            {"intent": "FIND_PROJECTS_BY_TECH", "args": {"tech": "Milvus"}},
        )
        path = await client.call_tool("graph_explain_path", {"from": "olena", "to": "Milvus"})
    assert answer_of(text)["matches"][0]["source_ref"]["id"] == "solar"
    assert "Solar microgrid" in text.content[0].text  # the citations as text, not JSON
    assert not text.content[0].text.startswith("{")
    sources = answer_of(enriched)["sources"]
    assert sources and sources[0]["id"] == "wiki/vector-search.md"
    assert [row["project"]["id"] for row in answer_of(projects)["rows"]] == ["prj_x"]
    assert "User 'olena' authored Doc 'Vector search'" in answer_of(path)["explanation"]


async def test_tool_errors_carry_the_gateway_error_body(gateway: str, team: str):
    async with mcp(gateway, **{"X-Team-Id": team}) as client:
        unscoped = await client.call_tool(
            "graph_query_context", {"cypher": "MATCH (p:Project) WITH p RETURN p"}
        )
        identity = await client.call_tool("rag_search_docs", {"query": "x", "team_id": "other"})
        top_k = await client.call_tool("rag_search_docs", {"query": "x", "top_k": 0})
        unknown = await client.call_tool("graph_explain_path", {"from": "nobody", "to": "Milvus"})
    forbidden = error_of(unscoped)
    assert forbidden["error"] == "forbidden" and forbidden["reason"] == "unscoped_variable"
    assert forbidden["status"] == 403 and forbidden["trace_id"]
    for result, field in ((identity, "team_id"), (top_k, "top_k")):
        body = error_of(result)
        assert body["error"] == "invalid_input" and body["fields"][0]["field"] == field
    assert error_of(unknown)["error"] == "not_found"
    async with mcp(gateway) as client:  # no X-Team-Id: a dev caller names no team of its own
        body = error_of(await client.call_tool("rag_search_docs", {"query": "Milvus"}))
    assert body["error"] == "invalid_input" and body["fields"][0]["field"] == "X-Team-Id"


def test_a_credential_that_does_not_verify_is_401_before_the_mcp_layer(client: httpx.Client):
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    r = client.post(
        "/mcp",
        json=initialize,
        headers={
            "authorization": "Bearer not-a-token",
            "accept": "application/json, text/event-stream",
        },
    )
    assert r.status_code == 401, r.text
    assert r.json()["error"] == "unauthorized" and r.json()["trace_id"]
    assert r.headers["www-authenticate"].startswith('Bearer realm="rag-gateway"')


async def test_the_team_comes_from_the_credential_and_another_team_is_forbidden(
    gateway: str, team: str, api_key: str
):
    from tests.serve.conftest import KEY_TEAM

    async with mcp(gateway, **{"X-API-Key": api_key}) as client:
        # No X-Team-Id: the key's only team; nothing indexed there, so no matches.
        own = answer_of(await client.call_tool("rag_search_docs", {"query": "Milvus"}))
    assert own["matches"] == [] and own["profile"]["name"] == "default"
    async with mcp(gateway, **{"X-API-Key": api_key, "X-Team-Id": team}) as client:
        body = error_of(await client.call_tool("rag_search_docs", {"query": "Milvus"}))
    assert body["error"] == "forbidden" and body["reason"] == "team_not_granted"
    assert body["status"] == 403 and KEY_TEAM in (body["hint"] or "")
