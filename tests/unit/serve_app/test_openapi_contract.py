"""The OpenAPI document states the rules the server enforces (serve_app/openapi.py): the
configured bounds, the forms of graph.query_context and the graph upsert, the event envelope,
one operation per agent tool, strings that must not be blank once stripped, and the rules it
cannot state in the descriptions. Each schema is checked against requests the server answers
and refuses, so the two cannot drift apart silently (tests/serve/test_contract_fuzz.py fuzzes
the whole document against the deployed app)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest

from serve_app.testing import build_gateway, claims, mint
from tests.unit.batch_ingest.events.test_events import envelope

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
TEAM = "dao_greenfood"
HEADERS = {"authorization": f"Bearer {mint(claims(teams={TEAM: ['owner']}))}"}


@pytest.fixture(scope="module")
def gw():
    return build_gateway(
        search={"max_query_chars": 1500},
        enrich={"max_draft_chars": 6000},
        ingest={"max_documents": 7, "max_document_chars": 5000},
        audit={"max_query_limit": 300},
    )


@pytest.fixture(scope="module")
def doc(gw) -> dict[str, Any]:
    r = gw.client.get("/openapi.json", headers=HEADERS)
    assert r.status_code == 200, r.text
    return r.json()


def validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """A validator of ``schema`` whose ``$ref``s resolve inside the OpenAPI document."""
    return jsonschema.Draft202012Validator(
        {**schema, "components": doc["components"]},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


def body_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def model(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return doc["components"]["schemas"][name]


def test_the_configured_bounds_are_the_schemas_bounds(doc):
    search = model(doc, "SearchDocsRequest")["properties"]
    assert search["query"]["maxLength"] == 1500
    assert model(doc, "EnrichAnswerRequest")["properties"]["draft_answer"]["maxLength"] == 6000
    assert model(doc, "IngestDocumentsRequest")["properties"]["documents"]["maxItems"] == 7
    assert model(doc, "SourceDocument")["properties"]["text"]["maxLength"] == 5000
    events = model(doc, "IngestEventsRequest")["properties"]["events"]
    assert events["maxItems"] == 7
    for form in events["items"]["oneOf"]:
        text = form["properties"]["payload"]["properties"].get("text")
        assert text is None or text["maxLength"] == 5000
    (limit,) = [
        p for p in doc["paths"]["/audit/decisions"]["get"]["parameters"] if p["name"] == "limit"
    ]
    assert limit["schema"]["maximum"] == 300
    tool = body_schema(doc, "/tools/rag_search_docs")
    assert tool["properties"]["query"]["maxLength"] == 1500


def test_the_bounds_are_the_servers(gw):
    over = {"team_id": TEAM, "query": "q" * 1501}
    assert gw.client.post("/rag/search_docs", json=over, headers=HEADERS).status_code == 422
    auditor = {"authorization": f"Bearer {mint(claims(permissions=['audit:read']))}"}
    r = gw.client.get("/audit/decisions", params={"limit": 301}, headers=auditor)
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "limit"


@pytest.mark.parametrize(
    "body, valid",
    [
        ({"intent": "DOCS_MENTIONING_TOPIC", "args": {"topic": "Milvus"}}, True),
        ({"cypher": "MATCH (n) WHERE n.team_id = $team_id RETURN n", "params": {"x": 1}}, True),
        ({}, False),  # neither form
        ({"intent": "DOCS_MENTIONING_TOPIC", "args": {"topic": "x"}, "cypher": "RETURN 1"}, False),
        ({"intent": "DOCS_MENTIONING_TOPIC", "args": {"topic": "   "}}, False),
        ({"intent": "DOCS_MENTIONING_TOPIC", "args": {"subject": "x"}}, False),
        ({"intent": "DOCS_MENTIONING_TOPIC"}, False),  # its required argument
        ({"intent": "DOCS_MENTIONING_TOPIC", "args": {"topic": "x"}, "params": {"a": 1}}, False),
        ({"cypher": "RETURN 1", "params": {"team_id": "other"}}, False),  # set by the gateway
        ({"cypher": "  "}, False),
    ],
)
def test_the_graph_query_schema_has_the_servers_two_forms(gw, doc, body, valid):
    full = {"team_id": TEAM, **body}
    schema_says = validator(doc, model(doc, "GraphQueryRequest")).is_valid(full)
    assert schema_says is valid
    answer = gw.client.post("/graph/query", json=full, headers=HEADERS)
    assert (answer.status_code == 200) is valid, answer.text
    tool_says = validator(doc, body_schema(doc, "/tools/graph_query_context")).is_valid(body)
    assert tool_says is valid


@pytest.mark.parametrize(
    "body, valid",
    [
        ({"nodes": [{"label": "User", "id": "u1"}]}, True),
        (
            {
                "relationships": [
                    {
                        "type": "USES",
                        "from": {"label": "User", "id": "u1"},
                        "to": {"label": "Resource", "id": "r1"},
                    }
                ]
            },
            True,
        ),
        ({}, False),
        ({"nodes": [], "relationships": []}, False),
        ({"nodes": [{"label": "User", "id": " "}]}, False),
        ({"nodes": [{"label": "User", "id": "u1", "properties": {"team_id": "x"}}]}, False),
        ({"nodes": [{"label": "User", "id": "u1", "properties": {"9bad": 1}}]}, False),
        # The team's own MicroDAO is accepted, but left out of the schema (id = team_id).
        ({"nodes": [{"label": "MicroDAO", "id": "another"}]}, False),
    ],
)
def test_the_graph_upsert_schema_refuses_what_the_server_refuses(gw, doc, body, valid):
    full = {"team_id": TEAM, **body}
    assert validator(doc, model(doc, "GraphUpsertRequest")).is_valid(full) is valid
    answer = gw.client.post("/graph/entities", json=full, headers=HEADERS)
    assert (answer.status_code == 200) is valid, answer.text


def test_the_tenant_aliases_are_described_not_offered(doc):
    for name in ("SearchDocsRequest", "EnrichAnswerRequest", "GraphQueryRequest"):
        props = model(doc, name)["properties"]
        for alias in ("dao_id", "microdao_id"):
            assert props[alias]["type"] == "null" and props[alias]["deprecated"] is True
            assert "team_id" in props[alias]["description"]


@pytest.mark.parametrize(
    "value, valid", [("dao_a", True), (" dao_a ", True), ("   ", False), ("\u3000", False)]
)
def test_an_identifier_must_not_be_blank_once_stripped(gw, doc, value, valid):
    body = {"team_id": value, "query": "Milvus"}
    assert validator(doc, model(doc, "SearchDocsRequest")).is_valid(body) is valid
    if not valid:
        assert gw.client.post("/rag/search_docs", json=body, headers=HEADERS).status_code == 422


def event(**changes: Any) -> dict[str, Any]:
    raw = envelope(payload={"doc_id": "d1", "text": "Milvus notes"})
    raw["meta"]["team_id"] = TEAM
    raw.update(changes)
    return raw


@pytest.mark.parametrize(
    "raw, valid",
    [
        (event(), True),
        (event(version="2.0"), False),
        (event(type="file.uploaded"), False),  # a doc.upserted payload
        (event(domain="chat"), False),
        (event(ts=-5), False),
        (event(payload={"doc_id": "d1", "text": "   "}), False),
        (event(payload={"doc_id": "d1", "text": "x", "doc_type": "Bad Type"}), False),
        (event(payload={"doc_id": "d1", "text": "x", "team_id": "dao_other"}), False),
        (event(payload={"doc_id": "d1", "text": "x", "revision": 2**60}), False),
    ],
)
def test_the_event_envelope_schema_refuses_what_the_server_refuses(gw, doc, raw, valid):
    items = model(doc, "IngestEventsRequest")["properties"]["events"]["items"]
    assert validator(doc, items).is_valid(raw) is valid
    answer = gw.client.post("/ingest/events", json={"events": [raw]}, headers=HEADERS)
    assert (answer.status_code == 200) is valid, answer.text


def test_each_tool_is_its_own_operation_with_its_arguments(doc):
    assert "/tools/{function}" not in doc["paths"]
    for function in ("rag_search_docs", "rag_enrich_answer", "graph_query_context"):
        operation = doc["paths"][f"/tools/{function}"]["post"]
        assert operation["security"] == [{"bearer": []}, {"api_key": []}]
        assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/plain"}
    explain = body_schema(doc, "/tools/graph_explain_path")
    assert explain["required"] == ["from", "to"] and explain["additionalProperties"] is False


def test_what_no_schema_can_state_is_in_the_descriptions(doc):
    created = model(doc, "SearchFilters")["properties"]["created_from"]["description"]
    assert "created_from must not be after created_to" in created
    audit = doc["paths"]["/audit/decisions"]["get"]["description"]
    assert re.search(r"since.*after.*until.*422", audit, re.S)
    assert "at most once per request" in model(doc, "IngestDocumentsRequest")["description"]
    assert "MicroDAO" in model(doc, "GraphUpsertRequest")["description"]
    assert "400" in model(doc, "GraphQueryRequest")["description"]  # Cypher that fails
