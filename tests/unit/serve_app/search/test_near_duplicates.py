"""rag.search_docs and near-duplicate passages (``search.near_duplicates``), end to end over
the fakes: by default a passage of another document repeating a better-ranked one stays as a
match citing its own source, with no snippet and ``duplicate_of`` naming the match it repeats;
``drop`` removes it, ``off`` keeps it whole; a token budget counts the repeated text once."""

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

TEAM = "dao_dup"
NOTE = (
    "The cold store of the cooperative runs on the solar array from May to September, "
    "and the diesel generator covers the nights when the batteries run low."
)
DOCS = [
    {"team_id": TEAM, "doc_id": "store-guide", "title": "Guide", "text": NOTE},
    {"team_id": TEAM, "doc_id": "store-guide-copy", "title": "Copy", "text": NOTE},
    {
        "team_id": TEAM,
        "doc_id": "orchard",
        "title": "Orchard",
        "text": "Apples and pears grow in the orchard beside the cold store.",
    },
]
QUERY = {"team_id": TEAM, "query": "cold store solar array batteries", "top_k": 5}


@pytest.fixture(scope="module")
def count():
    return tokenizer_counter(default_model_path())


def search(
    count, search_settings: dict[str, Any] | None = None, docs: list | None = None, **body: Any
) -> dict:
    settings = GatewaySettings(
        environment="test",
        auth={"mode": "dev"},
        embedder={"dim": 32},
        search=search_settings or {},
    )
    backends = Backends(
        embedder=FakeEmbedder(dim=32), store=FakeVectorStore(), graph=FakeGraphStore()
    )
    client = TestClient(create_app(build_services(settings, backends, count_tokens=count)))
    response = client.post("/ingest/documents", json={"documents": docs or DOCS})
    assert response.status_code == 200, response.text
    response = client.post("/rag/search_docs", json={**QUERY, **body})
    assert response.status_code == 200, response.text
    return response.json()


def by_doc(answer: dict) -> dict[str, dict]:
    return {m["source_ref"]["id"]: m for m in answer["matches"]}


def test_a_copy_in_another_document_is_cited_without_its_text_again(count):
    matches = by_doc(search(count))
    assert set(matches) == {"store-guide", "store-guide-copy", "orchard"}
    first, copy = sorted(
        (matches["store-guide"], matches["store-guide-copy"]), key=lambda m: -m["score"]
    )
    assert "duplicate_of" not in first and "solar array" in first["snippet"]
    assert copy["duplicate_of"] == first["chunk_id"] and copy["snippet"] == ""
    assert "duplicate_of" not in matches["orchard"]


def test_drop_leaves_one_copy(count):
    matches = by_doc(search(count, {"near_duplicates": "drop"}))
    assert len({"store-guide", "store-guide-copy"} & set(matches)) == 1
    assert all("duplicate_of" not in m for m in matches.values())


def test_off_keeps_both_copies_whole(count):
    matches = by_doc(search(count, {"near_duplicates": "off"}))
    copies = [matches["store-guide"], matches["store-guide-copy"]]
    assert all("solar array" in m["snippet"] and "duplicate_of" not in m for m in copies)


def test_a_budget_counts_the_repeated_text_once(count):
    # Room for the note once and the orchard line, not for the note twice.
    note_tokens = count(NOTE)
    answer = search(count, max_context_tokens=note_tokens + count(DOCS[2]["text"]) + 4)
    assert set(by_doc(answer)) == {"store-guide", "store-guide-copy", "orchard"}
    dropped = search(count, {"near_duplicates": "off"}, max_context_tokens=note_tokens + 4)
    assert len(dropped["matches"]) == 1


def test_a_copy_the_caller_may_not_see_leaves_no_trace(count):
    secret = {"team_id": TEAM, "doc_id": "secret-guide", "mode": "confidential", "text": NOTE}
    docs = [secret, DOCS[0], DOCS[2]]
    # A caller who may read it: the hidden copy ranks first, the public one repeats it.
    insider = by_doc(search(count, docs=docs, mode="confidential"))
    assert insider["store-guide"]["duplicate_of"] == insider["secret-guide"]["chunk_id"]
    # One who may not: the public copy stands alone, nothing points past what it may see.
    public = search(count, docs=docs)
    assert "secret-guide" not in by_doc(public)
    assert all("duplicate_of" not in m for m in public["matches"])
    assert "solar array" in by_doc(public)["store-guide"]["snippet"]
