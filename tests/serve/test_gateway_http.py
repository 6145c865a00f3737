"""The whole Serve application on a local Ray cluster, over HTTP, on real backends."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.serve

SAMPLE = Path(__file__).resolve().parents[2] / "batch_ingest" / "sample_corpus" / "sample.jsonl"


@pytest.fixture(scope="module")
def teams(client: httpx.Client) -> dict[str, str]:
    """Two fresh tenants with public and confidential documents."""
    a, b = f"dao_a_{uuid.uuid4().hex[:6]}", f"dao_b_{uuid.uuid4().hex[:6]}"
    docs = [
        {
            "team_id": a,
            "doc_id": "rag_spec",
            "title": "Spec microdao RAG stack",
            "text": "# RAG stack\n\nThe gateway stores chunks in Milvus and relations in Neo4j. "
            "Project prj_x already uses Milvus for hybrid search.",
            "project_id": "prj_x",
            "doc_type": "doc",
            "tags": ["rag", "milvus"],
            "url": "https://example.org/rag",
        },
        {
            "team_id": a,
            "doc_id": "salaries",
            "title": "Payroll",
            "text": "Confidential: payroll of the core team for Milvus engineers.",
            "visibility": "confidential",
            "doc_type": "file",
        },
        {
            "dao_id": b,
            "doc_id": "b_milvus",
            "title": "Other DAO Milvus notes",
            "text": "Team B evaluates Milvus as vector database.",
            "doc_type": "wiki",
        },
        {
            "team_id": a,
            "doc_id": "uk",
            "title": "Енергетика",
            "text": "Сонячні панелі та акумулятори живлять мікрогрід громади.",
            "doc_type": "wiki",
        },
    ]
    r = client.post("/ingest/documents", json={"documents": docs})
    assert r.status_code == 200, r.text
    assert r.json()["indexed"] == 4
    return {"a": a, "b": b}


def search(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/rag/search_docs", json=body)


def test_readyz_reports_every_component(client: httpx.Client):
    r = client.get("/readyz")
    assert r.status_code == 200
    assert set(r.json()["components"]) == {"embedder", "milvus", "neo4j", "audit"}
    assert r.json()["components"]["audit"]["ready"] is True
    assert client.get("/healthz").json() == {"status": "ok"}


def test_search_returns_spec_shape(client: httpx.Client, teams):
    r = search(
        client,
        agent_id="ag_daarwizz",
        team_id=teams["a"],
        top_k=5,
        query="які проєкти у нас вже використовують Milvus?",
        filters={"project_id": "prj_x", "doc_type": ["doc", "wiki"], "visibility": "public"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["degraded"] is False
    match = body["matches"][0]
    assert {"score", "title", "snippet", "source_ref"} <= set(match)
    assert match["title"] == "Spec microdao RAG stack"
    assert match["source_ref"] == {
        "type": "doc",
        "id": "rag_spec",
        "url": "https://example.org/rag",
        "team_id": teams["a"],
        "doc_type": "doc",
        "chunk_index": 0,
    }


def test_tenant_and_visibility_enforced(client: httpx.Client, teams):
    public = search(client, team_id=teams["a"], query="Milvus engineers payroll", top_k=10).json()
    assert {m["source_ref"]["id"] for m in public["matches"]} <= {"rag_spec", "uk"}
    assert all(m["source_ref"]["team_id"] == teams["a"] for m in public["matches"])
    wide = search(
        client, team_id=teams["a"], query="Milvus engineers payroll", top_k=10, mode="confidential"
    ).json()
    assert "salaries" in {m["source_ref"]["id"] for m in wide["matches"]}
    other = search(client, microdao_id=teams["b"], query="Milvus", top_k=10).json()
    assert {m["source_ref"]["id"] for m in other["matches"]} == {"b_milvus"}


def test_ukrainian_query_finds_ukrainian_document(client: httpx.Client, teams):
    r = search(client, team_id=teams["a"], query="сонячні панелі", top_k=1).json()
    assert r["matches"][0]["source_ref"]["id"] == "uk"


def test_reingest_is_idempotent(client: httpx.Client, teams):
    doc = {
        "team_id": teams["b"],
        "doc_id": "b_milvus",
        "title": "Other DAO Milvus notes",
        "text": "Team B evaluates Milvus as vector database.",
        "doc_type": "wiki",
    }
    r = client.post("/ingest/documents", json={"documents": [doc]}).json()
    assert r["unchanged"] == 1 and r["indexed"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"team_id": "t", "query": "", "top_k": 3}, "query"),
        ({"team_id": "t", "query": "x", "top_k": 0}, "top_k"),
        ({"team_id": "t", "query": "x", "top_k": 100000}, "top_k"),
        ({"team_id": "t", "query": "x", "top_k": "many"}, "top_k"),
        ({"query": "x"}, "team_id"),
        ({"team_id": "t", "query": "x", "filters": {"colour": "red"}}, "filters.colour"),
        ({"team_id": "t", "query": "x", "filters": {"visibility": "secret"}}, "filters.visibility"),
    ],
)
def test_bad_input_is_422_naming_the_field(client: httpx.Client, body, field):
    r = client.post("/rag/search_docs", json=body)
    assert r.status_code == 422
    assert field in [f["field"] for f in r.json()["fields"]]


def test_malformed_json_is_422(client: httpx.Client):
    r = client.post(
        "/rag/search_docs",
        content=b'{"team_id": "t", "query": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422


def test_bad_document_rejects_the_whole_batch_before_writing(client: httpx.Client, teams):
    fresh = f"doc_{uuid.uuid4().hex[:6]}"
    docs = [
        {"team_id": teams["a"], "doc_id": fresh, "text": "valid"},
        {"team_id": teams["a"], "doc_id": "bad", "text": ""},
    ]
    r = client.post("/ingest/documents", json={"documents": docs})
    assert r.status_code == 422
    assert "documents.1.text" in [f["field"] for f in r.json()["fields"]]
    hits = search(client, team_id=teams["a"], query="valid", top_k=50).json()["matches"]
    assert fresh not in {m["source_ref"]["id"] for m in hits}


def test_sample_corpus_validates_and_ingests(client: httpx.Client):
    lines = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    assert len(lines) >= 20
    r = client.post("/ingest/documents", json={"documents": lines})
    assert r.status_code == 200, r.text
    assert r.json()["failed"] == 0


async def test_concurrent_searches_all_succeed(gateway: str, teams):
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as ac:
        replies = await asyncio.gather(
            *(
                ac.post("/rag/search_docs", json={"team_id": teams["a"], "query": f"Milvus {i}"})
                for i in range(16)
            )
        )
    assert [r.status_code for r in replies] == [200] * 16


def test_reranker_deployment_rescores_candidates(client: httpx.Client, teams):
    ready = client.get("/rr/readyz").json()
    assert ready["components"]["reranker"]["ready"] is True
    body = search(client, team_id=teams["a"], query="Milvus hybrid search", top_k=3, explain=True)
    plain = body.json()
    r = client.post(
        "/rr/rag/search_docs",
        json={"team_id": teams["a"], "top_k": 3, "query": "Milvus hybrid search", "explain": True},
    )
    assert r.status_code == 200, r.text
    reranked = r.json()
    assert reranked["degraded"] is False
    assert all("rerank" in m["scores"] for m in reranked["matches"])
    assert [m["score"] for m in reranked["matches"]] == sorted(
        (m["score"] for m in reranked["matches"]), reverse=True
    )
    assert all("rerank" not in m["scores"] for m in plain["matches"])
    # Asking the plain app for a rerank it cannot do is said, not hidden.
    r = search(client, team_id=teams["a"], query="Milvus", rerank=True).json()
    assert r["degraded"] is True and "no reranker" in r["degraded_reasons"][0]
