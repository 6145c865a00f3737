"""The MCP server at /mcp (serve_app/tools/mcp.py), driven by the SDK's own client over the
Streamable HTTP transport against the in-process app (httpx2's ASGITransport, the app's
lifespan entered by the test): the catalog's tools, each call through ToolRunner, tool errors
in the gateway's error body, authentication before the MCP layer, the audit trail. Both
protocol eras: ``legacy`` (the initialize handshake, stateless) and ``auto`` (2026-07-28,
``server/discover`` then one POST per request)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import INTERNAL_ERROR

from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus
from serve_app.tools.catalog import TOOLS, mcp_tools

pytestmark = pytest.mark.usefixtures("clean_gateway_env")

BASE = "http://gateway.test"
QUERY = "Milvus gateway search notes"
MODES = ["legacy", "auto"]


def token(teams: dict[str, list[str]] | None = None, **overrides: Any) -> str:
    return mint(claims(teams=teams or {"dao_a": ["member"]}, **overrides))


@pytest.fixture
def gw():
    return build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx2.AsyncClient]:
    """The app with its lifespan entered (the MCP session manager runs), as an HTTP client."""
    async with app.router.lifespan_context(app):
        transport = httpx2.ASGITransport(app)
        async with httpx2.AsyncClient(transport=transport, base_url=BASE) as http:
            yield http


@asynccontextmanager
async def mcp(
    app: FastAPI, tok: str | None = None, mode: str = "auto", **headers: str
) -> AsyncIterator[Client]:
    """An SDK client connected to /mcp with ``tok`` and ``headers`` on every request."""
    if tok is not None:
        headers["authorization"] = f"Bearer {tok}"
    async with app.router.lifespan_context(app):
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app), base_url=BASE, headers=headers
        )
        async with (
            http,
            Client(streamable_http_client(f"{BASE}/mcp", http_client=http), mode=mode) as c,
        ):
            yield c


def node(label: str, id_: str, team: str = "dao_a", **props: Any) -> dict[str, Any]:
    """A graph node as the graph store returns it (public)."""
    return {
        "_type": "node",
        "labels": [label],
        "id": id_,
        "team_id": team,
        "visibility": "public",
    } | props


def error_of(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    assert result.structured_content is None
    return json.loads(result.content[0].text)


def answer_of(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    return result.structured_content


# --- listing ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_lists_exactly_the_catalog_tools_with_its_schemas(gw, mode):
    async with mcp(gw.client.app, token(), mode) as client:
        if mode == "legacy":
            assert client.protocol_version != "2026-07-28"
            assert client.server_info is not None and client.server_info.name == "rag-gateway"
        else:
            assert client.protocol_version == "2026-07-28"
        assert client.server_capabilities.tools is not None
        listed = (await client.list_tools()).tools
    catalog = mcp_tools(gw.services.settings)
    assert [t.name for t in listed] == [t.function for t in TOOLS]
    for tool, entry in zip(listed, catalog, strict=True):
        assert tool.name == entry["name"] and tool.title == entry["title"]
        assert tool.description == entry["description"]
        assert tool.input_schema == entry["inputSchema"]
        assert tool.output_schema == entry["outputSchema"]


# --- the four tools -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_search_answers_like_the_http_tool_route_inside_the_callers_team(gw, mode):
    tok, args = token(), {"query": QUERY, "top_k": 10}
    async with mcp(gw.client.app, tok, mode) as client:
        result = await client.call_tool("rag_search_docs", args)
    body = answer_of(result)
    assert json.loads(result.content[0].text) == body
    assert body["matches"] and {m["source_ref"]["team_id"] for m in body["matches"]} == {"dao_a"}
    async with running(gw.client.app) as http:
        r = await http.post(
            "/tools/rag_search_docs", json=args, headers={"authorization": f"Bearer {tok}"}
        )
    assert r.status_code == 200, r.text
    assert [m["chunk_id"] for m in body["matches"]] == [m["chunk_id"] for m in r.json()["matches"]]


async def test_text_format_is_the_text_rendering_with_the_structured_answer(gw):
    tok, args = token(), {"query": QUERY, "top_k": 3, "format": "text"}
    async with mcp(gw.client.app, tok) as client:
        result = await client.call_tool("rag_search_docs", args)
    body = answer_of(result)
    text = result.content[0].text
    assert not text.startswith("{") and str(len(body["matches"])) in text.splitlines()[0]
    assert body["matches"][0]["title"] in text
    async with running(gw.client.app) as http:
        r = await http.post(
            "/tools/rag_search_docs", json=args, headers={"authorization": f"Bearer {tok}"}
        )
    assert r.headers["content-type"].startswith("text/plain") and r.text == text


async def test_enrich_answer_cites_the_callers_documents(gw):
    draft = "The Milvus gateway search notes mention the deploy budget."
    async with mcp(gw.client.app, token()) as client:
        result = await client.call_tool("rag_enrich_answer", {"draft_answer": draft})
    body = answer_of(result)
    assert body["enriched_answer"] and body["sources"]
    assert all(s["team_id"] == "dao_a" for s in body["sources"] if "team_id" in s)


async def test_graph_query_context_runs_an_intent_in_the_callers_scope(gw):
    project, other = node("Project", "prj_open"), node("Project", "prj_b", team="dao_b")
    gw.services.backends.graph.results["FIND_PROJECTS_BY_TECH"] = {
        "columns": ["project"],
        "rows": [[project], [other]],
    }
    args = {"intent": "FIND_PROJECTS_BY_TECH", "args": {"tech": "Milvus"}}
    async with mcp(gw.client.app, token()) as client:
        body = answer_of(await client.call_tool("graph_query_context", args))
    assert [row["project"]["id"] for row in body["rows"]] == ["prj_open"]
    assert body["filtered_rows"] == 1 and body["intent"] == "FIND_PROJECTS_BY_TECH"
    name, _, scope = gw.services.backends.graph.calls[-1]
    assert name == "FIND_PROJECTS_BY_TECH" and scope.team_id == "dao_a"


async def test_explain_path_answers_a_path_or_a_not_found_tool_error(gw):
    args = {"from": "alice", "to": "Milvus"}
    async with mcp(gw.client.app, token()) as client:
        missing = error_of(await client.call_tool("graph_explain_path", args))
        alice, milvus = (
            node("User", "alice", name="Alice"),
            node("Resource", "milvus", name="Milvus"),
        )
        uses = {
            "_type": "relationship",
            "type": "USES",
            "start": {"label": "User", "id": "alice"},
            "end": {"label": "Resource", "id": "milvus"},
            "team_id": "dao_a",
            "visibility": "public",
        }
        gw.services.backends.graph.results["path"] = {
            "source": [alice],
            "target": [milvus],
            "paths": [{"_type": "path", "nodes": [alice, milvus], "relationships": [uses]}],
        }
        found = answer_of(await client.call_tool("graph_explain_path", args))
    assert missing["error"] == "not_found" and missing["status"] == 404
    assert missing["fields"][0]["field"] == "from"
    assert found["explanation"] == "User 'Alice' uses Resource 'Milvus'."


# --- tool errors --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_team_the_credential_does_not_grant_is_a_forbidden_tool_error(gw, mode):
    async with mcp(gw.client.app, token(), mode, **{"X-Team-Id": "dao_b"}) as client:
        body = error_of(await client.call_tool("rag_search_docs", {"query": QUERY}))
    assert body["error"] == "forbidden" and body["reason"] == "team_not_granted"
    assert body["status"] == 403 and body["message"] and body["trace_id"]
    assert "hint" in body


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"query": QUERY, "team_id": "dao_b"}, "team_id"),
        ({"query": QUERY, "top_k": 0}, "top_k"),
        ({"top_k": 3}, "query"),
    ],
)
async def test_a_bad_argument_is_an_invalid_input_tool_error_naming_it(gw, arguments, field):
    async with mcp(gw.client.app, token()) as client:
        body = error_of(await client.call_tool("rag_search_docs", arguments))
    assert body["error"] == "invalid_input" and body["status"] == 422
    assert body["fields"][0]["field"] == field
    if field == "team_id":
        assert "credential" in body["message"]


async def test_an_unknown_tool_is_a_not_found_tool_error(gw):
    async with mcp(gw.client.app, token()) as client:
        body = error_of(await client.call_tool("rag_drop_everything", {}))
    assert body["error"] == "not_found" and "rag_search_docs" in body["message"]


async def test_an_unexpected_exception_is_an_internal_error_without_its_details(gw, monkeypatch):
    async def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail of the failure")

    monkeypatch.setattr(gw.client.app.state.services.tools, "call", boom)
    async with mcp(gw.client.app, token()) as client:
        result = await client.call_tool("rag_search_docs", {"query": QUERY})
    body = error_of(result)
    assert body["error"] == "internal_error" and body["message"] == "RuntimeError"
    assert "secret" not in result.content[0].text and "Traceback" not in result.content[0].text


# --- authentication -----------------------------------------------------------------------

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
ACCEPT = {"accept": "application/json, text/event-stream"}


@pytest.mark.parametrize(
    ("headers", "challenge"),
    [
        ({}, 'Bearer realm="rag-gateway"'),
        (
            {"authorization": "Bearer not-a-jwt"},
            'Bearer realm="rag-gateway", error="invalid_token"',
        ),
    ],
)
async def test_no_or_a_bad_credential_is_401_before_the_mcp_layer_and_audited(
    gw, headers, challenge
):
    trace = uuid.uuid4().hex
    async with running(gw.client.app) as http:
        r = await http.post(
            "/mcp", json=INITIALIZE, headers={**ACCEPT, **headers, "x-trace-id": trace}
        )
    assert r.status_code == 401
    # RFC 9728 / MCP authorization: the challenge points at the resource's metadata.
    metadata = f"{BASE}/.well-known/oauth-protected-resource/mcp"
    assert r.headers["www-authenticate"] == f'{challenge}, resource_metadata="{metadata}"'
    body = r.json()
    assert body["error"] == "unauthorized" and body["trace_id"] == trace
    assert "Bearer" in body["hint"]
    assert gw.services.recorder.log.flush(5)
    (record,) = gw.services.recorder.log.query(trace_id=trace)
    assert record["action"] == "mcp" and record["decision"] == "deny"
    assert record["http_status"] == 401 and record["path"] == "/mcp"
    assert record["auth_method"] == ("jwt" if headers else "none")


async def test_the_sdk_client_without_a_token_cannot_connect(gw):
    with pytest.raises(BaseException) as failure:  # noqa: B017 (an ExceptionGroup of anyio's)
        async with mcp(gw.client.app) as client:
            await client.list_tools()
    errors = [failure.value]
    while isinstance(errors[-1], BaseExceptionGroup):
        errors.append(errors[-1].exceptions[0])
    # The SDK's transport turns a non-JSON-RPC 401 into this error of its own.
    assert isinstance(errors[-1], MCPError) and errors[-1].code == INTERNAL_ERROR


def test_without_the_app_lifespan_mcp_answers_503(gw):
    # build_gateway's TestClient is not entered, so no lifespan (and no session manager) ran.
    r = gw.client.post(
        "/mcp", json=INITIALIZE, headers={**ACCEPT, "authorization": f"Bearer {token()}"}
    )
    assert r.status_code == 503 and r.json()["error"] == "backend_unavailable"


async def test_the_lifespan_can_run_twice(gw):
    for _ in range(2):
        async with mcp(gw.client.app, token()) as client:
            assert len((await client.list_tools()).tools) == len(TOOLS)


# --- audit --------------------------------------------------------------------------------


async def test_a_tool_call_is_audited_with_the_verified_caller_and_trace_id(gw):
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    async with mcp(gw.client.app, token(), **{"X-Trace-Id": first}) as client:
        body = answer_of(await client.call_tool("rag_search_docs", {"query": QUERY}))
    async with mcp(
        gw.client.app, token(), **{"X-Trace-Id": second, "X-Team-Id": "dao_b"}
    ) as client:
        error_of(await client.call_tool("rag_search_docs", {"query": QUERY}))
    assert gw.services.recorder.log.flush(5)
    (allowed,) = gw.services.recorder.log.query(trace_id=first, action="search")
    assert allowed["decision"] == "allow" and allowed["subject"] == "alice"
    assert allowed["team_id"] == "dao_a" and allowed["auth_method"] == "jwt"
    assert allowed["query_sha256"] and allowed["http_status"] == 200
    assert allowed["chunk_ids"] == [m["chunk_id"] for m in body["matches"]]
    (denied,) = gw.services.recorder.log.query(trace_id=second, action="search")
    assert denied["decision"] == "deny" and denied["reason"] == "team_not_granted"
    assert denied["team_id"] == "dao_b" and denied["http_status"] == 403


async def test_get_is_405_not_an_event_stream_and_requests_count_under_mcp(gw, monkeypatch):
    """Issue 38, item 5: the stateless server offers no server-to-client stream, so GET /mcp
    is answered at once (405, Allow: POST, the gateway's error shape) instead of holding a
    request open; /mcp requests are labelled endpoint="/mcp" in the metrics."""
    from serve_app import metrics as sm

    labels: list[dict[str, str]] = []
    monkeypatch.setattr(sm.REQUEST_DURATION, "observe", lambda value, **tags: labels.append(tags))
    monkeypatch.setattr(type(sm.REQUEST_DURATION), "live", property(lambda self: True))
    async with running(gw.client.app) as http:
        got = await http.get("/mcp", headers={**ACCEPT, "authorization": f"Bearer {token()}"})
        posted = await http.post(
            "/mcp", json=INITIALIZE, headers={**ACCEPT, "authorization": f"Bearer {token()}"}
        )
    assert got.status_code == 405 and got.headers["allow"] == "POST"
    assert got.json()["error"] == "method_not_allowed"
    assert posted.status_code == 200, posted.text
    assert [t["endpoint"] for t in labels] == ["/mcp", "/mcp"]
    assert [t["status"] for t in labels] == ["4xx", "2xx"]


async def test_the_protected_resource_metadata_names_the_issuer_and_is_public(gw):
    """Issue 38, item 5: an OAuth client that got the 401 finds the authorization server
    from the metadata the challenge names (RFC 9728), without a credential."""
    async with running(gw.client.app) as http:
        unauthorised = await http.post("/mcp", json=INITIALIZE, headers=ACCEPT)
        challenge = unauthorised.headers["www-authenticate"]
        url = challenge.split('resource_metadata="', 1)[1].rstrip('"')
        r = await http.get(url)
        root = await http.get("/.well-known/oauth-protected-resource")
    assert r.status_code == 200 and root.status_code == 200
    body = r.json()
    assert body == root.json()
    assert body["resource"] == f"{BASE}/mcp"
    assert body["authorization_servers"] == [gw.services.settings.auth.issuer]
    assert body["bearer_methods_supported"] == ["header"]
