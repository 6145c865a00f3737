"""``GET /tools?format=openai-strict`` (issue 38, item 2): each tool's schema keeps to the
subset OpenAI documents for strict function calling ("Structured Outputs: supported
schemas"), checked here by a checker written from that page, not by the code that builds the
listing; and the calls a strict model can make — every property present, null where it has
nothing to say — are ones the server runs."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus
from serve_app.tools.args import GraphQueryArgs
from serve_app.tools.catalog import TOOLS
from serve_app.tools.strict import NotStrict, strict

# The documented subset: keywords per type, beside the ones any schema may carry.
ANY = {"type", "description", "enum", "const", "anyOf", "title"}
BY_TYPE = {
    "string": {"pattern", "format"},
    "number": {"multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"},
    "integer": {"multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"},
    "boolean": set(),
    "null": set(),
    "array": {"items", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties"},
}
FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
MAX_DEPTH, MAX_PROPERTIES, MAX_ENUM, MAX_STRING_CHARS = 10, 5000, 1000, 120_000


def violations(schema: dict[str, Any]) -> list[str]:
    """Every place ``schema`` leaves the strict subset."""
    found: list[str] = []
    totals = {"properties": 0, "enum": 0, "chars": 0}
    if schema.get("type") != "object" or "anyOf" in schema:
        found.append("root: must be an object, not anyOf")

    def walk(node: dict[str, Any], where: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            found.append(f"{where}: nested deeper than {MAX_DEPTH}")
        kinds = node.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds] if kinds else []
        if not kinds and "anyOf" not in node and "enum" not in node and "const" not in node:
            found.append(f"{where}: no type")
        allowed = set(ANY)
        for kind in kinds:
            if kind not in BY_TYPE:
                found.append(f"{where}: type {kind!r}")
                continue
            allowed |= BY_TYPE[kind]
        for key in set(node) - allowed:
            found.append(f"{where}: keyword {key!r}")
        if node.get("format") is not None and node["format"] not in FORMATS:
            found.append(f"{where}: format {node['format']!r}")
        if "enum" in node:
            totals["enum"] += len(node["enum"])
            totals["chars"] += sum(len(str(v)) for v in node["enum"])
        if "object" in kinds:
            props = node.get("properties") or {}
            if not props:
                found.append(f"{where}: free-form object")
            if node.get("additionalProperties") is not False:
                found.append(f"{where}: additionalProperties must be false")
            if sorted(node.get("required", [])) != sorted(props):
                found.append(f"{where}: every property must be required")
            totals["properties"] += len(props)
            for name, prop in props.items():
                totals["chars"] += len(name)
                walk(prop, f"{where}.{name}", depth + 1)
        if "array" in kinds:
            walk(node.get("items") or {}, f"{where}[]", depth + 1)
        for i, branch in enumerate(node.get("anyOf", [])):
            walk(branch, f"{where}|{i}", depth)

    walk(schema, "$", 1)
    if totals["properties"] > MAX_PROPERTIES:
        found.append(f"{totals['properties']} properties")
    if totals["enum"] > MAX_ENUM:
        found.append(f"{totals['enum']} enum values")
    if totals["chars"] > MAX_STRING_CHARS:
        found.append(f"{totals['chars']} characters of names and enum values")
    return found


# Calls a strict model makes: every property present, null where it has nothing to say.
STRICT_CALLS: dict[str, list[dict[str, Any]]] = {
    "rag_search_docs": [
        {"query": "Milvus gateway deploy budget", "top_k": None, "filters": None, "format": None},
        {
            "query": "Milvus budget",
            "top_k": 10,
            "filters": {
                "project_id": None,
                "channel_id": None,
                "doc_type": ["doc", "wiki"],
                "tags": None,
                "created_from": "2024-01-01",
                "created_to": None,
            },
            "format": "text",
        },
    ],
    "rag_enrich_answer": [
        {
            "draft_answer": "The gateway search notes mention Milvus.",
            "question": None,
            "max_docs": None,
            "filters": None,
            "format": None,
        },
    ],
    "graph_query_context": [
        {
            "intent": "MEMBERS_OF_DAO",
            "args": {"role": None, "limit": None},
            "cypher": None,
            "params": None,
            "format": None,
        },
        {
            "intent": "FIND_PROJECTS_BY_TECH",
            "args": {"tech": "Milvus", "limit": 5},
            "cypher": None,
            "params": None,
            "format": "text",
        },
    ],
    "graph_explain_path": [
        {"from": "alice", "to": "Milvus", "max_hops": None, "max_paths": None, "format": None},
    ],
}


@pytest.fixture(scope="module")
def gw():
    return build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())


def headers() -> dict[str, str]:
    return {"authorization": f"Bearer {mint(claims(teams={'dao_a': ['member']}))}"}


def listing(gw, fmt: str) -> dict[str, dict[str, Any]]:
    r = gw.client.get("/tools", params={"format": fmt}, headers=headers())
    assert r.status_code == 200, r.text
    return {t["function"]["name"]: t["function"] for t in r.json()["tools"]}


def test_every_tool_is_listed_strict_and_keeps_to_the_subset(gw):
    tools = listing(gw, "openai-strict")
    assert list(tools) == [t.function for t in TOOLS]
    for name, fn in tools.items():
        assert fn["strict"] is True
        jsonschema.Draft202012Validator.check_schema(fn["parameters"])
        assert violations(fn["parameters"]) == [], name


def test_the_checker_refuses_the_loose_listing(gw):
    """The loose listing has defaults, lengths and free-form objects: the checker must see
    them, or its silence above proves nothing."""
    problems = {n: violations(fn["parameters"]) for n, fn in listing(gw, "openai").items()}
    assert any("keyword 'default'" in p for p in problems["rag_search_docs"])
    assert any("keyword 'maxLength'" in p for p in problems["rag_search_docs"])
    assert any("free-form object" in p for p in problems["graph_query_context"])


def test_strict_bounds_are_the_servers(gw):
    """Lengths leave the schema in strict mode but not the listing: the description states
    the limit the server enforces (search.max_query_chars), numbers keep their maximum."""
    settings = gw.services.settings
    params = listing(gw, "openai-strict")["rag_search_docs"]["parameters"]["properties"]
    assert f"At most {settings.search.max_query_chars} characters" in params["query"]["description"]
    assert params["top_k"]["maximum"] <= settings.search.max_top_k


def test_each_intent_has_its_own_typed_arguments(gw):
    params = listing(gw, "openai-strict")["graph_query_context"]["parameters"]["properties"]
    branches = [b for b in params["args"]["anyOf"] if b.get("type") == "object"]
    intents = params["intent"]["anyOf"][0]["enum"]
    assert len(branches) == len(intents)
    for intent, branch in zip(intents, branches, strict=True):
        assert intent in branch["description"]
        assert branch["properties"], intent


@pytest.mark.parametrize(
    "function,call",
    [(f, c) for f, calls in STRICT_CALLS.items() for c in calls],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_strict_call_fits_the_schema_and_the_server_runs_it(gw, function, call):
    schema = listing(gw, "openai-strict")[function]["parameters"]
    jsonschema.validate(call, schema)
    r = gw.client.post(f"/tools/{function}", json=call, headers=headers())
    # The graph of the test corpus may not know an entity: its own 404, never a 422.
    assert r.status_code == 200 or (r.status_code == 404 and "no entity" in r.text), r.text
    if call.get("format") == "text":
        assert r.headers["content-type"].startswith("text/plain")


def test_a_null_in_a_strict_call_means_the_default(gw):
    full = STRICT_CALLS["rag_search_docs"][0]
    loose = {"query": full["query"]}
    a = gw.client.post("/tools/rag_search_docs", json=full, headers=headers()).json()
    b = gw.client.post("/tools/rag_search_docs", json=loose, headers=headers()).json()
    assert [m["chunk_id"] for m in a["matches"]] == [m["chunk_id"] for m in b["matches"]]


def test_cypher_params_come_as_pairs_or_a_mapping():
    pairs = [{"name": "tech", "value": "Milvus"}, {"name": "n", "value": None}]
    args = GraphQueryArgs.model_validate({"cypher": "RETURN 1", "params": pairs})
    assert args.params == {"tech": "Milvus", "n": None}
    assert GraphQueryArgs.model_validate({"params": {"tech": "x"}}).params == {"tech": "x"}
    for bad in ([{"name": "a", "value": 1}, {"name": "a", "value": 2}], [{"name": "a"}]):
        with pytest.raises(ValueError):
            GraphQueryArgs.model_validate({"params": bad})


def test_a_schema_without_a_strict_form_is_refused_not_listed_loosely():
    with pytest.raises(NotStrict, match="free-form"):
        strict({"type": "object", "properties": {"x": {"type": "object"}}})
