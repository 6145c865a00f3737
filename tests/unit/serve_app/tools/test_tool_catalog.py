"""The agent tool catalog and its faces: ``GET /tools`` in the OpenAI, MCP and router shapes
(names, plain object schemas, no tenancy or developer knobs an LLM could fill), each tool's
arguments completing into its full HTTP request, the 16 KiB text rendering, and
``POST /tools/{function}``'s tenancy answers (credential, X-Team-Id, X-Rag-Visibility)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from deployments.graph_store.intents import INTENTS
from serve_app.contracts import SourceRef
from serve_app.search.contracts import Match, SearchDocsResponse
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus
from serve_app.tools.catalog import TOOLS
from serve_app.tools.tenancy import ToolTenancy
from serve_app.tools.text import MAX_TEXT_BYTES, TRUNCATED, render
from tests.unit.serve_app.tools.test_router_config import CONFIG, MINIMAL_ARGUMENTS

NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# What an LLM must never be able to set: the tenant and caller (from the credential and the
# router's headers) and the developer knobs of the full HTTP requests.
FORBIDDEN_KEYS = {"team_id", "dao_id", "user_id", "agent_id", "fusion", "weights", "explain"}
BY_NAME = {t.name: t for t in TOOLS}
# Arguments using every field, at the largest values the argument schemas allow.
RICH_ARGUMENTS: dict[str, dict[str, Any]] = {
    "rag.search_docs": {
        "query": "  Milvus budget  ",
        "top_k": 10,
        "filters": {
            "project_id": "prj_open",
            "channel_id": "ch_1",
            "doc_type": ["doc", "wiki"],
            "tags": ["milvus"],
            "created_from": "2024-01-01",
            "created_to": "2030-01-01T00:00:00Z",
        },
        "format": "text",
    },
    "rag.enrich_answer": {
        "draft_answer": "Milvus stores the vectors.",
        "question": "Where are vectors stored?",
        "max_docs": 20,
        "filters": {"doc_type": ["doc"], "tags": ["rag"]},
        "format": "json",
    },
    "graph.query_context": {
        "intent": "find_projects_by_tech",
        "args": {"tech": "Milvus"},
        "format": "text",
    },
    "graph.explain_path": {"from": "alice", "to": "Milvus", "max_hops": 6, "max_paths": 10},
}


def auth(token: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **headers}


def member(*teams: str) -> str:
    return mint(claims(teams={t: ["member"] for t in teams or ("dao_a",)}))


@pytest.fixture(scope="module")
def gw():
    return build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())


def listing(gw, fmt: str) -> list[dict[str, Any]]:
    r = gw.client.get("/tools", params={"format": fmt}, headers=auth(member()))
    assert r.status_code == 200, r.text
    return r.json()["tools"]


def schema_keys(node: Any) -> set[str]:
    """Every mapping key and every ``required`` entry of a schema, at any depth."""
    keys: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            keys.add(key)
            if key == "required" and isinstance(value, list):
                keys.update(map(str, value))
            keys |= schema_keys(value)
    elif isinstance(node, list):
        for value in node:
            keys |= schema_keys(value)
    return keys


# --- GET /tools in each shape -------------------------------------------------------------


def test_openai_tools_are_functions_with_valid_names_and_object_schemas(gw):
    tools = listing(gw, "openai")
    assert len(tools) == len(TOOLS)
    for tool in tools:
        assert tool["type"] == "function"
        fn = tool["function"]
        assert NAME_RULE.fullmatch(fn["name"]), fn["name"]
        assert fn["description"].strip()
        params = fn["parameters"]
        assert params["type"] == "object" and isinstance(params["properties"], dict)
        # Plain: no references left for a provider that does not resolve them.
        assert not {"$ref", "$defs"} & schema_keys(params), fn["name"]
    assert [t["function"]["name"] for t in tools] == [t.function for t in TOOLS]


@pytest.mark.parametrize("fmt", ["openai", "openai-strict", "mcp", "router", "gateway"])
def test_no_tool_lets_an_llm_set_the_tenant_or_developer_knobs(gw, fmt):
    if fmt == "router":
        body = gw.client.get("/tools", params={"format": fmt}, headers=auth(member())).json()
        schemas = list(body["parameters"].items())
    else:
        schemas = [
            (
                tool.get("name") or tool["function"]["name"],
                tool["function"]["parameters"]
                if fmt.startswith("openai")
                else tool.get("inputSchema") or tool["arguments"],
            )
            for tool in listing(gw, fmt)
        ]
    assert len(schemas) == len(TOOLS)
    for name, schema in schemas:
        leaked = FORBIDDEN_KEYS & schema_keys(schema)
        assert not leaked, (name, leaked)


def test_mcp_tools_have_name_description_and_input_schema(gw):
    tools = listing(gw, "mcp")
    assert [t["name"] for t in tools] == [t.function for t in TOOLS]
    for tool in tools:
        assert NAME_RULE.fullmatch(tool["name"])
        assert tool["description"].strip()
        assert tool["inputSchema"]["type"] == "object"
        assert tool["title"] in BY_NAME


def test_router_entries_match_the_example_router_config(gw):
    r = gw.client.get("/tools", params={"format": "router"}, headers=auth(member()))
    body = r.json()
    ((provider_id, provider),) = body["orchestrator_providers"].items()
    assert provider_id in CONFIG["orchestrator_providers"]
    assert provider["base_url"] == "http://testserver" and provider["timeout_ms"] > 0
    entries = {e["id"]: e for e in body["tools"]}
    assert set(entries) == set(BY_NAME) == set(body["parameters"])
    example_base = CONFIG["orchestrator_providers"][provider_id]["base_url"]
    for agent_id, agent in CONFIG["agents"].items():
        for tool in agent.get("tools") or []:
            entry = entries[tool["id"]]
            # The same tool entry, for the example's base URL instead of this server's.
            mine = entry["endpoint"].replace(provider["base_url"], example_base, 1)
            assert tool["endpoint"] == mine, (agent_id, tool["id"])
            assert set(tool) == set(entry) == {"id", "type", "endpoint", "description"}
            assert tool["type"] == entry["type"] == "external"
    for schema in body["parameters"].values():
        assert schema["type"] == "object"


def test_the_gateway_listing_names_both_routes_of_each_tool(gw):
    for tool in listing(gw, "gateway"):
        spec = BY_NAME[tool["name"]]
        assert tool["function"] == spec.function
        assert tool["endpoint"] == f"POST {spec.route}"  # the full HTTP request
        assert tool["tool_endpoint"] == f"POST {spec.endpoint}"  # the LLM's arguments only


def test_the_graph_tool_description_names_only_real_intents():
    """The description an LLM reads gives an example intent; it must exist (and its example
    arguments must be that intent's)."""
    spec = BY_NAME["graph.query_context"]
    text = spec.description + " " + spec.parameters()["properties"]["intent"]["description"]
    known = set(INTENTS)
    named = set(re.findall(r"\b[A-Z]+(?:_[A-Z]+)+\b", text))
    assert named, "the description names no example intent"
    assert named <= known, f"unknown intents in the tool description: {sorted(named - known)}"
    assert spec.parameters()["properties"]["intent"]["anyOf"][0]["enum"] == list(INTENTS)
    for intent, raw in re.findall(r"\b([A-Z]+(?:_[A-Z]+)+) with (\{[^}]*\})", text):
        fields = set(INTENTS[intent.upper()].args.model_fields)
        assert set(json.loads(raw)) <= fields, (intent, raw)


# --- arguments complete into the full request ---------------------------------------------


@pytest.mark.parametrize("tool_id", list(BY_NAME))
@pytest.mark.parametrize("arguments", [MINIMAL_ARGUMENTS, RICH_ARGUMENTS], ids=["min", "rich"])
def test_arguments_complete_into_a_valid_full_request(tool_id, arguments):
    spec = BY_NAME[tool_id]
    args = spec.args.model_validate(arguments[tool_id])
    for visibility in ("public", "confidential"):
        request = spec.build(args, ToolTenancy("dao_a", visibility))
        assert isinstance(request, spec.request)
        assert request.team_id == "dao_a" and request.visibility == visibility
        # The completed request is itself a valid body of the full HTTP route.
        body = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        again = spec.request.model_validate(body)
        assert again.team_id == "dao_a"


def test_every_argument_reaches_the_full_request():
    search = BY_NAME["rag.search_docs"]
    request = search.build(
        search.args.model_validate(RICH_ARGUMENTS["rag.search_docs"]), ToolTenancy("dao_a")
    )
    assert request.query == "Milvus budget" and request.top_k == 10
    f = request.filters
    assert (f.project_id, f.channel_id, f.doc_type, f.tags) == (
        "prj_open",
        "ch_1",
        ["doc", "wiki"],
        ["milvus"],
    )
    assert f.created_from is not None and f.created_to is not None
    path = BY_NAME["graph.explain_path"]
    request = path.build(
        path.args.model_validate(RICH_ARGUMENTS["graph.explain_path"]), ToolTenancy("dao_a")
    )
    assert (request.max_hops, request.max_paths) == (6, 10)
    graph = BY_NAME["graph.query_context"]
    request = graph.build(
        graph.args.model_validate(RICH_ARGUMENTS["graph.query_context"]), ToolTenancy("dao_a")
    )
    assert request.intent == "FIND_PROJECTS_BY_TECH" and request.args == {"tech": "Milvus"}
    assert request.cypher is None and request.params == {}


# --- the text rendering -------------------------------------------------------------------


def response(snippet: str, n: int = 200, degraded: bool = True) -> SearchDocsResponse:
    return SearchDocsResponse(
        degraded=degraded,
        degraded_reasons=["embedder unavailable: lexical search only"] if degraded else [],
        matches=[
            Match(
                score=1 - i / n,
                title=f"Document {i} {snippet[:40]}",
                snippet=snippet,
                source_ref=SourceRef(
                    type="doc",
                    id=f"doc_{i}",
                    url=f"https://docs.example.test/{i}",
                    team_id="dao_a",
                    doc_type="doc",
                    chunk_index=0,
                ),
                chunk_id=f"c{i}",
            )
            for i in range(n)
        ],
        mode="bm25" if degraded else "hybrid",
        took_ms=1.0,
        trace_id="t",
    )


def assert_capped(resp: SearchDocsResponse) -> str:
    text = render(resp)
    full = render(resp, max_bytes=10**9)
    assert len(text.encode("utf-8")) <= MAX_TEXT_BYTES
    assert "\ufffd" not in text
    text.encode("utf-8").decode("utf-8")  # valid UTF-8 round trip
    assert text.endswith(TRUNCATED)
    # Whole lines of the full text, then at most one cut line, then the marker.
    lines, whole = text.split("\n"), full.split("\n")
    cut = len(lines) - 1
    if lines[cut - 1] != whole[cut - 1]:
        cut -= 1
        assert whole[cut].startswith(lines[cut])
        # Only a line that could never fit is cut inside; any other is left out whole.
        assert len(whole[cut].encode()) > MAX_TEXT_BYTES // 2, "cut inside a line that fits"
    assert lines[:cut] == whole[:cut]
    return text


def test_text_is_capped_at_16_kib_with_the_warning_first_and_the_marker_last():
    text = assert_capped(response("Milvus stores the vectors of the gateway. " * 20))
    first = text.split("\n", 1)[0]
    assert first == "WARNING degraded: embedder unavailable: lexical search only"
    assert len(text.encode()) > MAX_TEXT_BYTES - 1000  # the cap is used, not wasted


@pytest.mark.parametrize(
    "snippet",
    [
        "Ґрунтові води та водойми громади — звіт про якість 💧🌱 " * 30,
        "日本語のテキスト、絵文字👩‍👩‍👧‍👦と結合文字 é " * 40,
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 " * 3000,  # one line far over the cap: cut inside it
    ],
    ids=["cyrillic-emoji", "cjk-zwj", "one-huge-line"],
)
def test_multibyte_text_stays_valid_utf8_under_the_cap(snippet):
    text = assert_capped(response(snippet, n=200 if len(snippet) < 10_000 else 1))
    assert text.startswith("WARNING degraded:")


def test_a_short_answer_is_not_truncated():
    text = render(response("short", n=3, degraded=False))
    assert TRUNCATED not in text and not text.startswith("WARNING")
    assert text.split("\n")[0] == "3 passages (search: hybrid):"


def test_a_huge_degraded_reason_still_fits_the_cap():
    resp = response("x", n=3)
    resp.degraded_reasons = ["backend said: " + "e" * 20_000]
    text = render(resp)
    assert text.startswith("WARNING degraded:")
    assert len(text.encode()) <= MAX_TEXT_BYTES


# --- POST /tools/{function}: formats, argument errors, tenancy ----------------------------


def call(gw, function: str, arguments: Any, token: str | None = None, **headers: str):
    return gw.client.post(
        f"/tools/{function}", json=arguments, headers=auth(token or member(), **headers)
    )


def test_format_text_answers_text_plain(gw):
    r = call(gw, "rag_search_docs", {"query": "Milvus deploy budget", "format": "text"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert re.match(r"[1-5] passages \(search: hybrid\):\n\[1\] ", r.text), r.text
    assert "dao_b" not in r.text


def test_format_json_is_the_routes_own_answer(gw):
    r = call(gw, "rag_search_docs", {"query": "Milvus deploy budget", "top_k": 2})
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert len(body["matches"]) == 2
    assert {m["source_ref"]["team_id"] for m in body["matches"]} == {"dao_a"}


def test_top_k_over_the_tool_maximum_is_cut_to_it(gw):
    schema = BY_NAME["rag.search_docs"].parameters()["properties"]["top_k"]
    assert schema["maximum"] == 10
    r = call(gw, "rag_search_docs", {"query": "Milvus gateway search notes", "top_k": 40})
    assert r.status_code == 200, r.text
    assert 0 < len(r.json()["matches"]) <= 10
    r = call(gw, "rag_search_docs", {"query": "Milvus", "top_k": 0})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "top_k"


@pytest.mark.parametrize("key", ["team_id", "dao_id", "agent_id", "user_id"])
def test_an_identity_key_in_the_arguments_is_422_naming_the_credential(gw, key):
    r = call(gw, "rag_search_docs", {"query": "Milvus", key: "dao_b"})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["fields"][0]["field"] == key
    assert "unknown argument" in body["message"] and "credential" in body["message"]
    assert "X-Team-Id" in body["message"]


def test_a_developer_knob_in_the_arguments_is_422(gw):
    for key, value in {"fusion": "rrf", "explain": True, "weights": {"dense": 1}}.items():
        r = call(gw, "rag_search_docs", {"query": "Milvus", key: value})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == key


def test_x_team_id_of_a_team_the_credential_does_not_grant_is_403(gw):
    r = call(gw, "rag_search_docs", {"query": "Milvus"}, member("dao_a"), **{"X-Team-Id": "dao_b"})
    assert r.status_code == 403, r.text
    assert r.json()["reason"] == "team_not_granted"


def test_a_multi_team_credential_needs_x_team_id(gw):
    token = member("dao_a", "dao_b")
    r = call(gw, "rag_search_docs", {"query": "Milvus"}, token)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["fields"][0]["field"] == "X-Team-Id" and "X-Team-Id" in body["message"]
    assert "2 teams" in body["message"]
    for header in ("X-Team-Id", "X-Dao-Id"):
        r = call(gw, "rag_search_docs", {"query": "Milvus deploy"}, token, **{header: "dao_b"})
        assert r.status_code == 200, r.text
        assert {m["source_ref"]["team_id"] for m in r.json()["matches"]} == {"dao_b"}


def test_team_headers_that_disagree_are_422(gw):
    r = call(
        gw,
        "rag_search_docs",
        {"query": "Milvus"},
        member("dao_a", "dao_b"),
        **{"X-Team-Id": "dao_a", "X-Dao-Id": "dao_b"},
    )
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "X-Team-Id"


def test_x_rag_visibility_widens_only_where_the_credential_allows(gw):
    args = {"query": "Milvus deploy budget", "top_k": 10}
    r = call(gw, "rag_search_docs", args, **{"X-Rag-Visibility": "secret"})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "X-Rag-Visibility"
    r = call(gw, "rag_search_docs", args, **{"X-Rag-Visibility": "confidential"})
    assert r.status_code == 403 and r.json()["reason"] == "confidential_not_granted"
    owner = mint(claims(teams={"dao_a": ["owner"]}, groups=["ops", "board"]))
    public = call(gw, "rag_search_docs", args, owner).json()["matches"]
    wide = call(gw, "rag_search_docs", args, owner, **{"X-Rag-Visibility": "Confidential"})
    assert wide.status_code == 200, wide.text
    assert not any("conf" in m["source_ref"]["id"] for m in public)
    assert any("conf" in m["source_ref"]["id"] for m in wide.json()["matches"])


def test_without_a_credential_a_tool_call_is_401(gw):
    r = gw.client.post("/tools/rag_search_docs", json={"query": "Milvus"})
    assert r.status_code == 401


def test_dotted_names_run_the_same_tool(gw):
    r = call(gw, "rag.search_docs", {"query": "Milvus deploy budget", "top_k": 1})
    assert r.status_code == 200 and len(r.json()["matches"]) == 1


def test_every_bad_argument_is_listed_with_its_own_problem(gw):
    r = call(gw, "rag_search_docs", {"query": "", "top_k": 0})
    assert r.status_code == 422
    fields = {f["field"]: f["problem"] for f in r.json()["fields"]}
    assert set(fields) == {"query", "top_k"}
    assert "top_k" not in fields["query"]


def test_a_duplicate_is_rendered_as_a_pointer_to_the_match_with_its_text():
    resp = response("Milvus keeps the vectors.", n=3, degraded=False)
    resp.matches[2].snippet, resp.matches[2].duplicate_of = "", "c0"
    lines = render(resp).split("\n")
    assert lines[-2].startswith("[3] Document 2") and lines[-1] == "    (the same text as [1])"
    assert lines[2] == "    Milvus keeps the vectors."
