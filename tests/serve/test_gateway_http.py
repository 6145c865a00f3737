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
    assert set(r.json()["components"]) == {"embedder", "milvus", "neo4j", "audit", "cache"}
    assert r.json()["components"]["audit"]["ready"] is True
    # On a CPU device the ingress embeds search queries with its own copy of the model.
    queries = r.json()["components"]["embedder"]["queries"]
    assert queries["location"] == "ingress" and queries["ready"] is True
    assert queries["local_slots"] == 1
    assert queries["model"] == r.json()["components"]["embedder"]["model"]
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


def test_enrich_answer_cites_a_supported_claim_and_reports_nonsense(client: httpx.Client):
    team = f"dao_e_{uuid.uuid4().hex[:6]}"
    docs = [
        {
            "team_id": team,
            "doc_id": "gateway_spec",
            "title": "Gateway spec",
            "url": "https://example.org/gateway",
            "text": "The gateway stores document chunks in Milvus and keeps entity relations "
            "in Neo4j.",
        },
        {
            "team_id": team,
            "doc_id": "energy",
            "title": "Energy",
            "text": "Solar panels and batteries power the community microgrid.",
            "doc_type": "wiki",
        },
    ]
    r = client.post("/ingest/documents", json={"documents": docs})
    assert r.status_code == 200, r.text
    nonsense = "Purple elephants dance on quantum keyboards."
    draft = f"The gateway stores chunks in Milvus. {nonsense}"
    r = client.post(
        "/rag/enrich_answer",
        json={"team_id": team, "question": "How is data stored?", "draft_answer": draft},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["degraded"] is False
    assert [s["id"] for s in body["sources"]] == ["gateway_spec"]
    assert body["sources"][0]["url"] == "https://example.org/gateway"
    assert body["enriched_answer"] == f"The gateway stores chunks in Milvus.[1] {nonsense}"
    assert body["unsupported_claims"] == [nonsense]


def test_graph_tools_end_to_end(client: httpx.Client, teams):
    """Ingestion writes the graph (wiki-links, project, tags); entities come through
    /graph/entities; intents, caller Cypher, explain_path and graph-boosted search answer
    from the real Neo4j inside the caller's team."""
    a, b = teams["a"], teams["b"]
    notes = [
        {
            "team_id": a,
            "doc_id": "wiki/vector-search.md",
            "title": "Vector search",
            "text": "# Vector search\n\nHow we run [[Hybrid retrieval]] on Milvus.",
            "project_id": "prj_x",
            "doc_type": "wiki",
            "tags": ["milvus"],
            "author_id": "olena",
        },
        {
            "team_id": a,
            "doc_id": "wiki/hybrid-retrieval.md",
            "title": "Hybrid retrieval",
            "text": "# Hybrid retrieval\n\nDense and BM25 candidates fused by weights.",
            "doc_type": "wiki",
        },
    ]
    assert client.post("/ingest/documents", json={"documents": notes}).status_code == 200
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

    intents = client.get("/graph/intents").json()["intents"]
    assert len(intents) >= 8
    r = client.post(
        "/graph/query",
        json={"team_id": a, "intent": "FIND_PROJECTS_BY_TECH", "args": {"tech": "Milvus"}},
    )
    assert r.status_code == 200, r.text
    assert [row["project"]["id"] for row in r.json()["rows"]] == ["prj_x"]
    r = client.post(
        "/graph/query",
        json={"team_id": a, "intent": "LINKED_DOCS", "args": {"doc": "Vector search"}},
    )
    assert [(x["direction"], x["doc"]["id"]) for x in r.json()["rows"]] == [
        ("links_to", "wiki/hybrid-retrieval.md")
    ]
    # The spec's own Cypher example, with the tenant predicate the gateway requires.
    spec = {
        "team_id": a,
        "mode": "confidential",
        "cypher": "MATCH (p:Project)-[:USES]->(r:Resource {name: $name}) "
        "WHERE p.team_id = $team_id RETURN p LIMIT 10",
        "params": {"name": "Milvus"},
    }
    r = client.post("/graph/query", json=spec)
    assert r.status_code == 200, r.text
    assert [row["p"]["id"] for row in r.json()["rows"]] == ["prj_x"]
    # A simple unscoped query is scoped by the gateway itself (deployments/graph_store/scope.py);
    # one it cannot rewrite (WITH) is refused, naming the variable.
    r = client.post("/graph/query", json={**spec, "cypher": "MATCH (p:Project) RETURN p"})
    assert r.status_code == 200, r.text
    assert "prj_x" in [row["p"]["id"] for row in r.json()["rows"]]
    r = client.post("/graph/query", json={**spec, "cypher": "MATCH (p:Project) WITH p RETURN p"})
    assert r.status_code == 403 and r.json()["reason"] == "unscoped_variable"
    r = client.post("/graph/query", json={**spec, "cypher": "MATCH (n) DETACH DELETE n"})
    assert r.status_code == 403 and r.json()["reason"] == "not_read_only"
    r = client.post("/graph/query", json={**spec, "cypher": "MATCH (p:Project RETURN p"})
    assert r.status_code == 400 and "Invalid input" in r.json()["message"]
    # Raised inside the Graph replica, the row limit crosses Ray as itself: its 422 and reason.
    r = client.post("/graph/query", json={**spec, "cypher": "UNWIND range(1, 1001) AS x RETURN x"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "query_limit_exceeded" and r.json()["reason"] == "row_limit"

    r = client.post(
        "/graph/explain_path",
        json={"team_id": a, "from": "olena", "to": {"name": "Milvus", "label": "Resource"}},
    )
    assert r.status_code == 200, r.text
    assert "User 'olena' authored Doc 'Vector search'" in r.json()["explanation"]
    r = client.post("/graph/explain_path", json={"team_id": b, "from": "olena", "to": "Milvus"})
    assert r.status_code == 404

    r = search(client, team_id=a, query="hybrid retrieval with Milvus", graph="boost")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["graph"]["applied"] is True
    assert {e["id"] for e in body["graph"]["entities"]} & {"milvus", "wiki/hybrid-retrieval.md"}
    assert all(m["source_ref"]["team_id"] == a for m in body["matches"])


# Short notes beside the six greenhouse documents: the team is past 1,000 chunks.
FILLER_NOTES = 1_000


def test_admin_reindex_swaps_the_team_while_it_is_searched(client: httpx.Client):
    """POST /admin/reindex runs the Ray Data job on the Serve cluster (a Ray task) the way
    users start it: 2 logical CPUs (as scripts/start.sh gives Ray), the Serve replicas holding
    most of them, a team of more than 1,000 chunks. Searches of the team keep answering
    during the job and the alias swap, and find the same documents afterwards."""
    import time

    from tests.integration.test_reindex import TOPICS

    team = f"dao_reidx_{uuid.uuid4().hex[:6]}"
    docs = [
        {
            "team_id": team,
            "doc_id": f"note{i}",
            "title": f"Greenhouse note {i}",
            "text": f"Greenhouse {i} grows tomatoes with drip irrigation and solar pumps. "
            + " ".join(f"detail{i}_{j}" for j in range(40)),
        }
        for i in range(6)
    ]
    r = client.post("/ingest/documents", json={"documents": docs})
    assert r.status_code == 200 and r.json()["indexed"] == 6, r.text
    notes = [
        {
            "team_id": team,
            "doc_id": f"filler{i}",
            "title": TOPICS[i % len(TOPICS)],
            "text": f"Meeting {i}: {TOPICS[i % len(TOPICS)]}, item {i % 17} of the agenda.",
        }
        for i in range(FILLER_NOTES)
    ]
    for start in range(0, len(notes), 250):
        r = client.post("/ingest/documents", json={"documents": notes[start : start + 250]})
        assert r.status_code == 200 and r.json()["indexed"] == len(notes[start : start + 250])
    query = {"team_id": team, "query": "drip irrigation tomatoes", "top_k": 6}
    before = {m["source_ref"]["id"] for m in search(client, **query).json()["matches"]}
    assert len(before) == 6

    r = client.post("/admin/reindex", json={})
    assert r.status_code == 422 and "team_id" in r.text
    assert client.get("/admin/reindex/no-such-job").status_code == 404
    r = client.post("/admin/reindex", json={"team_id": team})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    searches, deadline = 0, time.monotonic() + 420
    while True:
        r = search(client, **query)
        assert r.status_code == 200, r.text
        assert {m["source_ref"]["id"] for m in r.json()["matches"]} == before
        searches += 1
        job = client.get(f"/admin/reindex/{job_id}").json()
        if job["status"] not in ("queued", "running", "switching"):
            break
        assert time.monotonic() < deadline, f"reindex still {job['status']}: {job}"
        time.sleep(1)
    assert job["status"] == "succeeded", job
    assert job["target_version"] == (job["source_version"] or 0) + 1
    assert job["rows_in_target"] == job["expected_chunks"] > FILLER_NOTES
    assert job["total_docs"] == job["done_docs"] == FILLER_NOTES + 6
    assert searches > 1
    after = search(client, **query, explain=True).json()["matches"]
    assert {m["source_ref"]["id"] for m in after} == before


def test_vault_cli_imports_over_http(gateway: str, client: httpx.Client, tmp_path, capsys):
    """python -m serve_app.cli.vault with its own HTTP client against the running gateway:
    notes become searchable wiki documents and their [[links]] graph edges."""
    from serve_app.cli.vault import main

    team = f"dao_vault_{uuid.uuid4().hex[:6]}"
    root = tmp_path / "vault"
    (root / "ops").mkdir(parents=True)
    (root / "ops" / "runbook.md").write_text(
        "---\ntitle: Night runbook\ntags: [oncall]\n---\n# Night runbook\n\n"
        "When the greenhouse pump alarm fires, follow [[Pump reset]].\n",
        encoding="utf-8",
    )
    (root / "ops" / "pump-reset.md").write_text(
        "# Pump reset\n\nCut power for ten seconds, then restart the pump controller.\n",
        encoding="utf-8",
    )
    assert main([str(root), "--team", team, "--url", gateway]) == 0
    assert "done: indexed 2, unchanged 0, failed 0" in capsys.readouterr().out
    r = search(client, team_id=team, query="restart the pump controller", top_k=2)
    assert r.status_code == 200, r.text
    assert r.json()["matches"][0]["source_ref"]["id"] == "ops/pump-reset.md"
    r = client.post(
        "/graph/query",
        json={"team_id": team, "intent": "LINKED_DOCS", "args": {"doc": "Night runbook"}},
    )
    assert r.status_code == 200, r.text
    assert [(x["direction"], x["doc"]["id"]) for x in r.json()["rows"]] == [
        ("links_to", "ops/pump-reset.md")
    ]
    # A second run changes nothing.
    assert main([str(root), "--team", team, "--url", gateway]) == 0
    assert "indexed 0, unchanged 2, failed 0" in capsys.readouterr().out


def test_document_acls_through_the_deployed_app(client: httpx.Client):
    """Dev mode (the body's user_id is the subject): an ACL'd document reaches only its
    users through search and enrich, and lifting the list re-permissions it without
    embedding again."""
    team = f"dao_acl_{uuid.uuid4().hex[:6]}"
    private = {
        "team_id": team,
        "doc_id": "alice_notes",
        "title": "Alice's quarterly budget notes",
        "text": "The quarterly budget of the greenhouse project is kept by Alice only.",
        "acl": {"allowed_users": ["alice"]},
    }
    public = {
        "team_id": team,
        "doc_id": "open_notes",
        "title": "Greenhouse project",
        "text": "The greenhouse project grows tomatoes with solar heating.",
    }
    r = client.post("/ingest/documents", json={"documents": [private, public]})
    assert r.status_code == 200 and r.json()["indexed"] == 2, r.text

    def found(user: str) -> set[str]:
        body = {"team_id": team, "user_id": user, "query": "greenhouse budget", "top_k": 10}
        r = search(client, **body)
        assert r.status_code == 200, r.text
        return {m["source_ref"]["id"] for m in r.json()["matches"]}

    assert found("alice") == {"alice_notes", "open_notes"}
    assert found("bob") == {"open_notes"}
    enrich = client.post(
        "/rag/enrich_answer",
        json={
            "team_id": team,
            "user_id": "bob",
            "question": "What is the quarterly budget of the greenhouse project?",
            "draft_answer": "The quarterly budget of the greenhouse project is kept by Alice.",
        },
    )
    assert enrich.status_code == 200, enrich.text
    assert "alice_notes" not in {s["doc_id"] for s in enrich.json()["sources"]}
    # The list lifted: re-written with the stored vectors, and bob reads it now.
    lifted = {k: v for k, v in private.items() if k != "acl"}
    r = client.post("/ingest/documents", json={"documents": [lifted]})
    assert r.status_code == 200, r.text
    (doc,) = r.json()["documents"]
    assert doc["status"] == "indexed" and doc["embedded_chunks"] == 0
    assert found("bob") == {"alice_notes", "open_notes"}
