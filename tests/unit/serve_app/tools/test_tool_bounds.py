"""Issue 38, item 1: every bound a tool listing advertises is one the server enforces. Each
listing (GET /tools in its four formats, the OpenAPI document) is read for the advertised
maximum of each bounded field; a call at that maximum is answered 200, one past it 422."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus

# Smaller than the defaults, so a listing that ignored the settings would be caught.
LIMITS = {"max_query_chars": 300, "max_draft_chars": 500, "max_top_k": 7}


@pytest.fixture(scope="module")
def gw():
    return build_gateway(
        policy=TENANCY_POLICY,
        corpus=tenancy_corpus(),
        search={"max_query_chars": LIMITS["max_query_chars"], "max_top_k": LIMITS["max_top_k"]},
        enrich={"max_draft_chars": LIMITS["max_draft_chars"]},
    )


def headers() -> dict[str, str]:
    token = mint(claims(teams={"dao_a": ["member"]}))
    return {"authorization": f"Bearer {token}", "x-team-id": "dao_a"}


def arguments(gw, fmt: str) -> dict[str, dict[str, Any]]:
    """Each tool's argument schema as the listing ``fmt`` gives it, by function name."""
    r = gw.client.get("/tools", params={"format": fmt}, headers=headers())
    assert r.status_code == 200, r.text
    if fmt == "router":  # the router's tool entries carry no schema; "parameters" does
        return {k.replace(".", "_"): v for k, v in r.json()["parameters"].items()}
    out = {}
    for tool in r.json()["tools"]:
        if fmt == "openai":
            out[tool["function"]["name"]] = tool["function"]["parameters"]
        elif fmt == "mcp":
            out[tool["name"]] = tool["inputSchema"]
        else:
            out[tool["function"]] = tool["arguments"]
    return out


def bound(schema: dict[str, Any], name: str, keyword: str) -> int:
    prop = schema["properties"][name]
    forms = [p for p in prop.get("anyOf", []) if p.get("type") != "null"] or [prop]
    return min(f[keyword] for f in forms)


def words(n: int) -> str:
    """``n`` characters of real-looking text (no leading or trailing blank)."""
    text = ("milvus gateway search notes deploy " * (n // 10 + 1))[:n]
    return text[:-1] + "x" if text.endswith(" ") else text


@pytest.mark.parametrize("fmt", ["openai", "mcp", "router", "gateway"])
def test_each_advertised_maximum_is_accepted_and_one_more_is_refused(gw, fmt):
    schemas = arguments(gw, fmt)
    query_max = bound(schemas["rag_search_docs"], "query", "maxLength")
    draft_max = bound(schemas["rag_enrich_answer"], "draft_answer", "maxLength")
    assert query_max == LIMITS["max_query_chars"] and draft_max == LIMITS["max_draft_chars"]
    assert bound(schemas["rag_search_docs"], "top_k", "maximum") <= LIMITS["max_top_k"]

    def call(function: str, body: dict[str, Any]):
        return gw.client.post(f"/tools/{function}", json=body, headers=headers())

    r = call("rag_search_docs", {"query": words(query_max)})
    assert r.status_code == 200, r.text
    r = call("rag_search_docs", {"query": words(query_max + 1)})
    assert r.status_code == 422 and "query" in r.text, r.text
    top_k = bound(schemas["rag_search_docs"], "top_k", "maximum")
    assert call("rag_search_docs", {"query": "milvus", "top_k": top_k}).status_code == 200
    r = call("rag_enrich_answer", {"draft_answer": words(draft_max)})
    assert r.status_code == 200, r.text
    r = call("rag_enrich_answer", {"draft_answer": words(draft_max + 1)})
    assert r.status_code == 422 and "draft" in r.text, r.text


def test_the_full_routes_advertise_and_accept_the_same_maximums(gw):
    tools = {
        t["name"]: t["input_schema"]
        for t in gw.client.get("/tools", headers=headers()).json()["tools"]
    }
    openapi = gw.client.get("/openapi.json", headers=headers()).json()["components"]["schemas"]
    for schema in (tools["rag.search_docs"], openapi["SearchDocsRequest"]):
        assert bound(schema, "query", "maxLength") == LIMITS["max_query_chars"]
        assert bound(schema, "top_k", "maximum") == LIMITS["max_top_k"]
    for schema in (tools["rag.enrich_answer"], openapi["EnrichAnswerRequest"]):
        assert bound(schema, "draft_answer", "maxLength") == LIMITS["max_draft_chars"]
    auth = {"authorization": headers()["authorization"]}
    body = {"team_id": "dao_a", "query": words(LIMITS["max_query_chars"])}
    r = gw.client.post("/rag/search_docs", json=body | {"top_k": LIMITS["max_top_k"]}, headers=auth)
    assert r.status_code == 200, r.text
    body = {"team_id": "dao_a", "draft_answer": words(LIMITS["max_draft_chars"])}
    assert gw.client.post("/rag/enrich_answer", json=body, headers=auth).status_code == 200
