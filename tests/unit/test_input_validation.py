"""Input the stores cannot hold is a 422 naming the field, in the gateway's error shape:
non-finite numbers (Python's json reads NaN, Infinity and 1e999), lone UTF-16 surrogates
(no UTF-8 form: Neo4j and the embedder fail on them), fusion weights whose products overflow,
the same document twice in one ingest request, an event naming another team than its
``meta.team_id`` anywhere in its payload, and a body nested deeper than ``MAX_JSON_DEPTH``
levels (a 900-deep Cypher ``params`` was a 503: Ray could not pickle it to the Graph
replica)."""

from __future__ import annotations

import json

import pytest

from deployments.validation import (
    MAX_JSON_DEPTH,
    MAX_REPORTED,
    invalid_values,
    reject_invalid_values,
)
from serve_app.ingest.contracts import IngestDocumentsRequest
from serve_app.search.contracts import SearchDocsRequest
from serve_app.testing import build_gateway, claims, mint
from tests.unit.batch_ingest.events.test_events import envelope

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
TEAM = "dao_greenfood"
OTHER = "dao_other"
CORPUS = [
    {"team_id": TEAM, "doc_id": "d1", "text": "Milvus stores the vectors of the gateway"},
    {"team_id": TEAM, "doc_id": "d2", "text": "Neo4j keeps the graph; Milvus the chunks"},
]


@pytest.fixture(scope="module")
def gw():
    return build_gateway(corpus=CORPUS)


def headers(teams: dict[str, list[str]] | None = None) -> dict[str, str]:
    token = mint(claims(teams=teams or {TEAM: ["owner"], OTHER: ["owner"]}))
    return {"authorization": f"Bearer {token}", "content-type": "application/json"}


def post(gw, path: str, body: object):
    """``body`` as Python's json writes it: NaN and Infinity as those literals, a lone
    surrogate as its ``\\ud800`` escape (what a careless client sends); a ``str`` as it is."""
    raw = body if isinstance(body, str) else json.dumps(body)
    return gw.client.post(path, content=raw.encode(), headers=headers())


def refused(r, *fields: str) -> dict:
    """A 422 in the gateway's validation shape naming exactly ``fields``."""
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "invalid_input" and body["trace_id"], body
    assert "detail" not in body
    assert [f["field"] for f in body["fields"]] == list(fields), body
    for name in fields:
        assert name in body["message"]
    return body


def search(**extra) -> dict:
    return {"team_id": TEAM, "query": "Milvus", **extra}


NAN, INF = float("nan"), float("inf")
CYPHER = "MATCH (d:Doc) WHERE d.id IN $ids RETURN d"


# --- non-finite numbers and fusion weights -------------------------------------------------


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_a_non_finite_min_score_is_422(gw, value):
    body = refused(post(gw, "/rag/search_docs", search(min_score=value)), "min_score")
    assert "finite" in body["fields"][0]["problem"]


def test_a_number_too_large_for_a_float_is_422_not_infinity(gw):
    raw = json.dumps(search()).replace('"Milvus"', '"Milvus", "min_score": 1e999')
    refused(post(gw, "/rag/search_docs", raw), "min_score")


@pytest.mark.parametrize("value", [INF, NAN, 1e308, 1000.5, -1], ids=str)
def test_fusion_weights_out_of_range_or_not_finite_are_422(gw, value):
    body = search(fusion="weighted", weights={"dense": value, "bm25": 0.5})
    refused(post(gw, "/rag/search_docs", body), "weights.dense")


def test_the_largest_fusion_weights_give_finite_scores(gw):
    body = search(fusion="weighted", weights={"dense": 1000, "bm25": 1000})
    r = post(gw, "/rag/search_docs", body)
    assert r.status_code == 200, r.text
    scores = [m["score"] for m in r.json()["matches"]]
    assert scores and all(isinstance(s, float) for s in scores)


def test_nan_in_the_graph_option_and_in_cypher_params_is_422(gw):
    refused(post(gw, "/rag/search_docs", search(graph={"weight": NAN})), "graph.weight")
    body = {"team_id": TEAM, "cypher": CYPHER, "params": {"ids": [1, INF]}}
    refused(post(gw, "/graph/query", body), "params.ids.1")


def test_a_non_finite_graph_property_is_422(gw):
    node = {"label": "Resource", "id": "milvus", "properties": {"load": NAN}}
    refused(
        post(gw, "/graph/entities", {"team_id": TEAM, "nodes": [node]}), "nodes.0.properties.load"
    )


def test_the_models_refuse_non_finite_floats_built_in_python_too():
    with pytest.raises(ValueError, match="finite"):
        SearchDocsRequest(team_id=TEAM, query="x", min_score=NAN)
    with pytest.raises(ValueError, match="less than or equal to 1000"):
        SearchDocsRequest.model_validate(
            {"team_id": TEAM, "query": "x", "weights": {"dense": 1e308}}
        )


# --- invalid Unicode -------------------------------------------------------------------------

BAD = "\ud800"


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/graph/query", {"team_id": TEAM, "cypher": CYPHER, "params": {"x": BAD}}, "params.x"),
        (
            "/graph/query",
            {"team_id": TEAM, "cypher": CYPHER, "params": {"ids": ["ok", {"deep": [BAD]}]}},
            "params.ids.1.deep.0",
        ),
        ("/graph/query", {"team_id": TEAM, "cypher": CYPHER, "params": {BAD: 1}}, "params.\\ud800"),
        (
            "/graph/query",
            {"team_id": TEAM, "intent": "DOCS_MENTIONING_TOPIC", "args": {"topic": "a" + BAD}},
            "args.topic",
        ),
        ("/rag/search_docs", search(query="Milvus " + BAD), "query"),
        ("/rag/search_docs", search(filters={"tags": ["ok", BAD]}), "filters.tags.1"),
        (
            "/rag/enrich_answer",
            {"team_id": TEAM, "draft_answer": f"A {BAD} claim."},
            "draft_answer",
        ),
        (
            "/ingest/documents",
            {"documents": [{"team_id": TEAM, "doc_id": "u", "text": "bad " + BAD}]},
            "documents.0.text",
        ),
    ],
    ids=[
        "cypher_param",
        "nested_param",
        "param_name",
        "intent_arg",
        "query",
        "filter_tag",
        "draft",
        "document_text",
    ],
)
def test_a_lone_surrogate_anywhere_in_a_body_is_422_naming_the_field(gw, path, body, field):
    answer = refused(post(gw, path, body), field)
    assert "surrogate" in answer["fields"][0]["problem"]


def test_a_valid_surrogate_pair_is_text_like_any_other(gw):
    # json writes U+1F600 as the pair \ud83d\ude00, which it reads back as one character.
    r = post(gw, "/rag/search_docs", search(query="Milvus \U0001f600"))
    assert r.status_code == 200, r.text


def test_invalid_values_walks_any_depth_in_document_order_and_stops_at_the_limit():
    data = {"a": [1, NAN, {"b": "x" + BAD, "\udc00k": 1}], "c": -INF}
    assert [(loc, kind) for loc, kind, _, _ in invalid_values(data)] == [
        (("a", 1), "finite_number"),
        (("a", 2, "b"), "string_unicode"),
        (("a", 2, "\\udc00k"), "string_unicode"),
        (("c",), "finite_number"),
    ]
    deep: list = []
    cursor = deep
    for _ in range(5000):  # deeper than Python's recursion limit
        cursor.append([])
        cursor = cursor[0]
    cursor.append(NAN)
    assert len(invalid_values(deep, max_depth=None)[0][0]) == 5001
    # With the bound (the default), the walk stops at it and names the top-level field.
    assert [(loc, kind) for loc, kind, _, _ in invalid_values({"top": deep})] == [
        (("top",), "json_too_deep")
    ]
    assert len(invalid_values([INF] * 1000)) == MAX_REPORTED
    assert reject_invalid_values({"ok": [1.5, "text"]}) == {"ok": [1.5, "text"]}


# --- the same document twice in one request --------------------------------------------------


def test_the_same_document_twice_in_one_request_is_422_and_nothing_is_written():
    gw = build_gateway()
    docs = [
        {"team_id": TEAM, "doc_id": "dup", "text": "long " * 2000},
        {"team_id": TEAM, "doc_id": "other", "text": "fine"},
        # The aliases and the whitespace do not make it another document.
        {"dao_id": f" {TEAM}", "id": "dup ", "text": "short"},
    ]
    r = gw.client.post("/ingest/documents", json={"documents": docs}, headers=headers())
    body = refused(r, "documents.2.doc_id")
    assert "'dup'" in body["fields"][0]["problem"]
    assert "documents.0" in body["fields"][0]["problem"]
    assert not gw.store.rows


def test_the_same_doc_id_in_two_teams_is_two_documents():
    gw = build_gateway()
    docs = [
        {"team_id": TEAM, "doc_id": "same", "text": "one"},
        {"team_id": OTHER, "doc_id": "same", "text": "two"},
    ]
    r = gw.client.post("/ingest/documents", json={"documents": docs}, headers=headers())
    assert r.status_code == 200, r.text
    assert r.json()["indexed"] == 2


def test_the_request_model_names_every_repeat():
    docs = [{"team_id": TEAM, "doc_id": d, "text": "x"} for d in ("a", "b", "a", "b", "a")]
    with pytest.raises(ValueError) as info:
        IngestDocumentsRequest.model_validate({"documents": docs})
    errors = info.value.errors()  # type: ignore[attr-defined]
    assert [e["loc"] for e in errors] == [
        ("documents", 2, "doc_id"),
        ("documents", 3, "doc_id"),
        ("documents", 4, "doc_id"),
    ]


# --- events over HTTP ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"document": {"team_id": OTHER}}, "events.0.payload.document.team_id"),
        (
            {"documents": [{"team_id": TEAM}, {"dao_id": OTHER}]},
            "events.0.payload.documents.1.dao_id",
        ),
        ({"microdao_id": OTHER}, "events.0.payload.microdao_id"),
    ],
)
def test_an_event_naming_another_team_in_its_payload_is_422_over_http(extra, field):
    gw = build_gateway()
    event = envelope(payload={"doc_id": "d1", "text": "Milvus notes", **extra})
    event["meta"]["team_id"] = TEAM
    r = gw.client.post("/ingest/events", json={"events": [event]}, headers=headers())
    refused(r, field)
    assert not gw.store.rows


def test_a_lone_surrogate_in_an_event_is_422_over_http():
    gw = build_gateway()
    event = envelope(payload={"doc_id": "d1", "text": "bad " + BAD})
    event["meta"]["team_id"] = TEAM
    refused(post(gw, "/ingest/events", {"events": [event]}), "events.0.payload.text")
    assert not gw.store.rows


# --- nesting depth -------------------------------------------------------------------------


def nested(levels: int) -> object:
    """A value of ``levels`` nested objects and arrays (objects and arrays alternate)."""
    value: object = "leaf"
    for level in range(levels):
        value = {"k": value} if level % 2 else [value]
    return value


def graph_query(params_levels: int) -> dict:
    """A Cypher request whose body nests ``params_levels`` + 1 levels (the body is level 1)."""
    return {"team_id": TEAM, "cypher": CYPHER, "params": {"ids": nested(params_levels - 1)}}


def test_params_nested_900_levels_are_422_naming_params_and_the_limit(gw):
    body = refused(post(gw, "/graph/query", graph_query(900)), "params")
    problem = body["fields"][0]["problem"]
    assert f"at most {MAX_JSON_DEPTH}" in problem and "params.ids" in problem, problem


def test_a_body_one_level_over_the_limit_is_422_and_at_the_limit_is_answered(gw):
    refused(post(gw, "/graph/query", graph_query(MAX_JSON_DEPTH)), "params")
    r = post(gw, "/graph/query", graph_query(MAX_JSON_DEPTH - 1))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/rag/search_docs", search(filters={"tags": nested(MAX_JSON_DEPTH)}), "filters"),
        (
            "/graph/query",
            {"team_id": TEAM, "intent": "DOCS_MENTIONING_TOPIC", "args": {"t": nested(900)}},
            "args",
        ),
        (
            "/graph/entities",
            {"team_id": TEAM, "nodes": [{"label": "User", "id": "u", "properties": nested(99)}]},
            "nodes",
        ),
    ],
    ids=["search_filters", "intent_args", "entity_properties"],
)
def test_every_free_form_field_is_bounded_the_same_way(gw, path, body, field):
    answer = refused(post(gw, path, body), field)
    assert f"at most {MAX_JSON_DEPTH}" in answer["fields"][0]["problem"]


def test_deep_tool_arguments_are_422_naming_the_argument(gw):
    raw = json.dumps({"cypher": CYPHER, "params": {"ids": nested(900)}})
    r = gw.client.post(
        "/tools/graph_query_context",
        content=raw.encode(),
        headers={**headers(), "x-team-id": TEAM},
    )
    answer = refused(r, "params")
    assert f"at most {MAX_JSON_DEPTH}" in answer["fields"][0]["problem"]


def test_a_deep_event_payload_is_422_over_http_and_invalid_when_partial():
    gw = build_gateway()
    event = envelope(payload={"doc_id": "d1", "text": "Milvus notes", "extra": nested(900)})
    event["meta"]["team_id"] = TEAM
    refused(post(gw, "/ingest/events", {"events": [event]}), "events.0.payload")
    r = post(gw, "/ingest/events", {"events": [event], "partial": True})
    assert r.status_code == 200, r.text
    (result,) = r.json()["events"]
    assert result["status"] == "invalid" and str(MAX_JSON_DEPTH) in result["error"], result
    assert not gw.store.rows


def test_a_date_time_outside_the_years_1_to_9999_in_utc_is_422_not_500(gw):
    body = search(filters={"created_from": "0001-01-01T00:00:00+01:00"})
    refused(post(gw, "/rag/search_docs", body), "filters.created_from")
    event = envelope(payload={"doc_id": "d1", "text": "Milvus notes"})
    event["meta"]["team_id"] = TEAM
    event["ts"] = "9999-12-31T23:59:59-01:00"
    refused(post(gw, "/ingest/events", {"events": [event]}), "events.0.ts")
