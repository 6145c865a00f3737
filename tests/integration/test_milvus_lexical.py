"""The learned sparse ``lexical`` field (BGE-M3's weights) on the real Milvus Lite server:
created only for a lexical store, written, read back for stored-vector reuse, searched by
inner product inside the tenant filter; a collection built without it keeps working."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from deployments.protocols import SearchFilter
from deployments.vector_store.store import MilvusStore
from tests.integration.test_milvus_store import chunk

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lexical_store(settings):
    ms = settings.milvus.model_copy(update={"collection": f"{settings.milvus.collection}_lex"})
    store = MilvusStore(ms, dim=384, lexical=True)
    store.start()
    yield store
    store.drop()
    store.close()


@pytest.fixture
def team() -> str:
    return f"team_{uuid.uuid4().hex[:8]}"


def test_lexical_weights_round_trip_and_search(lexical_store: MilvusStore, team: str):
    rows = [
        replace(chunk(team, "a", text="alpha beta"), lexical={11: 0.9, 12: 0.1}),
        replace(chunk(team, "b", text="beta gamma"), lexical={12: 0.5, 13: 0.4}),
        replace(
            chunk(team, "conf", text="alpha secret", visibility="confidential"),
            lexical={11: 2.0},
        ),
        replace(chunk(team + "_x", "foreign", text="alpha"), lexical={11: 5.0}),
        chunk(team, "none", text="no weights"),  # stored with the placeholder
    ]
    lexical_store.upsert(rows)
    lexical_store.flush()
    name = lexical_store.collection_for(team)
    assert lexical_store.shapes.has_lexical(name)

    flt = SearchFilter(team_id=team, visibilities=("public",))
    hits = lexical_store.search("", None, flt, 10, "lexical", {11: 1.0, 12: 1.0})
    assert [h.chunk.doc_id for h in hits] == ["a", "b"]  # 1.0 vs 0.5; other team, conf out
    assert hits[0].scores["lexical"] == pytest.approx(1.0, abs=1e-4)
    assert hits[1].score == pytest.approx(0.5, abs=1e-4)
    # No token in common: nothing; the dense and BM25 methods are untouched by the field.
    assert lexical_store.search("", None, flt, 10, "lexical", {99: 1.0}) == []
    assert lexical_store.search("alpha", None, flt, 10, "bm25")[0].chunk.doc_id == "a"

    stored = {c.doc_id: c for c in lexical_store.stored_chunks(team, [r.chunk_id for r in rows])}
    assert stored["a"].lexical == pytest.approx({11: 0.9, 12: 0.1})
    assert stored["none"].lexical == {}
    assert len(stored["a"].vector) == 384


def test_collection_without_the_field_keeps_working(store: MilvusStore, team: str):
    # ``store`` (the session's) was built without learned sparse weights: a chunk that
    # carries some is stored without them, and the lexical method finds nothing there.
    weighted = replace(chunk(team, "a", text="alpha beta"), lexical={11: 0.9})
    store.upsert([weighted])
    store.flush()
    assert not store.shapes.has_lexical(store.collection_for(team))
    flt = SearchFilter(team_id=team, visibilities=("public",))
    assert store.search("", None, flt, 10, "lexical", {11: 1.0}) == []
    assert [h.chunk.doc_id for h in store.search("alpha", None, flt, 10, "bm25")] == ["a"]
    (back,) = store.stored_chunks(team, [weighted.chunk_id])
    assert back.lexical is None
