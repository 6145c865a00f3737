"""Learned sparse weights (BGE-M3's lexical head) end to end over the fakes: ingestion
stores them beside the vectors, a hybrid search fuses them as a third list with its own
weight and ``explain`` score, and a gateway whose embedder makes none never asks for them."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from batch_ingest.chunking import tokenizer_counter
from deployments.models.embedding import default_model_path
from deployments.protocols import Backends
from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeVectorStore
from serve_app.asgi import create_app
from serve_app.composition import build_services
from serve_app.settings import GatewaySettings

TEAM = "dao_lex"
DOCS = [
    {"team_id": TEAM, "doc_id": "apples", "text": "Apples and pears grow in the orchard."},
    {"team_id": TEAM, "doc_id": "milvus", "text": "Milvus stores the vectors of the orchard."},
    {"team_id": TEAM, "doc_id": "neo4j", "text": "Neo4j keeps the graph of entities."},
]
QUERY = {"agent_id": "ag", "team_id": TEAM, "query": "orchard apples", "top_k": 3}
M3 = {"backend": "flag_m3", "model_path": "/models/bge-m3", "dim": 32}


@pytest.fixture(scope="module")
def count():
    return tokenizer_counter(default_model_path())


def gateway(count, *, lexical: bool, settings: dict[str, Any] | None = None):
    gateway_settings = GatewaySettings(
        environment="test",
        auth={"mode": "dev"},
        embedder=M3 if lexical else {"dim": 32},
        **(settings or {}),
    )
    embedder, store = FakeEmbedder(dim=32, lexical=lexical), FakeVectorStore()
    backends = Backends(embedder=embedder, store=store, graph=FakeGraphStore())
    client = TestClient(create_app(build_services(gateway_settings, backends, count_tokens=count)))
    response = client.post("/ingest/documents", json={"documents": DOCS})
    assert response.status_code == 200, response.text
    return client, embedder, store


def modes(store: FakeVectorStore) -> list[str]:
    return [mode for *_, mode in store.searches]


def test_ingestion_stores_the_weights_beside_the_vectors(count):
    _, embedder, store = gateway(count, lexical=True)
    rows = list(store.rows.values())
    assert rows and all(r.lexical for r in rows)
    apples = next(r for r in rows if r.doc_id == "apples")
    assert apples.lexical == FakeEmbedder.weights(apples.text)


def test_hybrid_search_fuses_a_third_list_and_explains_it(count):
    client, _, store = gateway(count, lexical=True)
    response = client.post("/rag/search_docs", json=QUERY | {"explain": True})
    assert response.status_code == 200, response.text
    matches = response.json()["matches"]
    assert "lexical" in modes(store)
    assert matches[0]["source_ref"]["id"] == "apples"
    assert "lexical" in matches[0]["scores"]
    assert {"dense", "bm25"} & set(matches[0]["scores"])


def test_lexical_weight_alone_orders_by_the_sparse_scores(count):
    client, _, _ = gateway(count, lexical=True)
    body = QUERY | {
        "query": "orchard orchard pears",
        "explain": True,
        "fusion": "weighted",
        "weights": {"dense": 0, "bm25": 0, "lexical": 1},
    }
    matches = client.post("/rag/search_docs", json=body).json()["matches"]
    with_lexical = [m for m in matches if "lexical" in m["scores"]]
    # apples shares "orchard" and "pears", milvus only "orchard": the sparse order decides.
    assert [m["source_ref"]["id"] for m in with_lexical] == ["apples", "milvus"]
    assert with_lexical[0]["scores"]["lexical"] > with_lexical[1]["scores"]["lexical"]


def test_weight_zero_leaves_the_list_out(count):
    client, _, store = gateway(count, lexical=True, settings={"search": {"lexical_weight": 0}})
    client.post("/rag/search_docs", json=QUERY)
    assert "lexical" not in modes(store)
    body = QUERY | {"weights": {"dense": 0.5, "bm25": 0.5, "lexical": 0.2}}
    client.post("/rag/search_docs", json=body)
    assert "lexical" in modes(store)  # the request's weight wins


def test_without_a_lexical_embedder_nothing_changes(count):
    client, embedder, store = gateway(count, lexical=False)
    response = client.post("/rag/search_docs", json=QUERY | {"explain": True})
    assert response.status_code == 200
    assert "lexical" not in modes(store)
    assert all(r.lexical is None for r in store.rows.values())
    assert all("lexical" not in m["scores"] for m in response.json()["matches"])


def test_metadata_only_change_keeps_the_stored_weights(count):
    client, embedder, store = gateway(count, lexical=True)
    embedded = len(embedder.embedded_texts)
    changed = [dict(DOCS[0], tags=["fruit"])]
    assert client.post("/ingest/documents", json={"documents": changed}).status_code == 200
    assert len(embedder.embedded_texts) == embedded  # not embedded again
    apples = next(r for r in store.rows.values() if r.doc_id == "apples")
    assert apples.tags == ("fruit",) and apples.lexical == FakeEmbedder.weights(apples.text)


def test_flag_m3_needs_a_model_path():
    with pytest.raises(ValueError, match="model_path"):
        GatewaySettings(environment="test", embedder={"backend": "flag_m3"})
