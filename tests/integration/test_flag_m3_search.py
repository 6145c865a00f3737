"""BGE-M3 (a tiny random one, built here) end to end on the real Milvus Lite server: the
pipeline stores dense vectors and learned sparse weights, and rag.search_docs fuses dense,
BM25 and the ``lexical`` list, explaining each (no Ray, no download)."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from deployments.models.embedding import LocalEmbedder
from deployments.protocols import Backends
from deployments.testing.tiny_models import build_tiny_m3
from deployments.vector_store.deployment import RetrieverDeployment
from serve_app.asgi import create_app
from serve_app.composition import build_services
from serve_app.settings import GatewaySettings

pytestmark = pytest.mark.integration

DOCS = [
    ("solar", "Solar panels charge the batteries of the cooperative."),
    ("graph", "Neo4j keeps entities and their relations."),
    ("ledger", "Quarterly ledger totals for the treasury."),
]


@pytest.fixture(scope="module")
def gateway(settings, tmp_path_factory):
    path = build_tiny_m3(tmp_path_factory.mktemp("m3") / "tiny-m3")
    milvus = settings.milvus.model_copy(update={"collection": f"{settings.milvus.collection}_m3"})
    gateway_settings = GatewaySettings(
        environment="test",
        auth={"mode": "dev"},
        embedder={"backend": "flag_m3", "model_path": str(path), "model_name": "tiny-m3"},
        milvus=milvus,
    )
    embedder = LocalEmbedder(gateway_settings.embedder)
    embedder.core.start()
    retriever = RetrieverDeployment(milvus, embedder.core.dim or 0, lexical=True)
    backends = Backends(embedder=embedder, store=retriever, graph=None)
    services = build_services(gateway_settings, backends, count_tokens=embedder.core.count_tokens)
    with TestClient(create_app(services)) as client:
        yield client, retriever
    retriever.store.drop()
    retriever.store.close()


def test_stored_weights_and_three_way_fusion(gateway):
    client, retriever = gateway
    team = f"team_{uuid.uuid4().hex[:8]}"
    documents = [{"team_id": team, "doc_id": d, "text": t} for d, t in DOCS]
    response = client.post("/ingest/documents", json={"documents": documents})
    assert response.status_code == 200, response.text
    store = retriever.store
    name = store.collection_for(team)
    assert store.shapes.has_lexical(name)
    ids = [c.chunk_id for d, _ in DOCS for c in store.get_chunks(team, "doc", d)]
    stored = store.stored_chunks(team, ids)
    assert len(stored) == len(DOCS) and all(c.lexical for c in stored)

    query = {"agent_id": "ag", "team_id": team, "query": DOCS[0][1], "top_k": 3, "explain": True}
    matches = client.post("/rag/search_docs", json=query).json()["matches"]
    assert matches[0]["source_ref"]["id"] == "solar"
    assert "lexical" in matches[0]["scores"] and matches[0]["scores"]["lexical"] > 0
    # The learned sparse list alone: the document the query repeats shares every token.
    only = query | {"fusion": "weighted", "weights": {"dense": 0, "bm25": 0, "lexical": 1}}
    matches = client.post("/rag/search_docs", json=only).json()["matches"]
    assert matches[0]["source_ref"]["id"] == "solar"
    scores = [m["scores"].get("lexical", 0.0) for m in matches]
    assert scores == sorted(scores, reverse=True)
