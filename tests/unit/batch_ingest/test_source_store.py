"""The source-document registry on SQLite (PostgreSQL uses the same SQLAlchemy Core code)."""

from __future__ import annotations

import pytest

from batch_ingest.documents import SourceDocument
from batch_ingest.source_store import SourceStore
from deployments.errors import BackendUnavailable


def doc(doc_id: str, team: str = "t1", text: str = "hello world", **kw) -> SourceDocument:
    return SourceDocument(team_id=team, doc_id=doc_id, text=text, **kw)


@pytest.fixture
def store(tmp_path):
    s = SourceStore(f"sqlite:///{tmp_path}/state.db")
    yield s
    s.close()


def test_put_get_and_iterate_a_team_in_key_order(store):
    store.put([doc("b"), doc("a"), doc("x", team="t2")])
    assert [d.doc_id for d in store.iter_team("t1", batch=1)] == ["a", "b"]
    assert store.count("t1") == 2 and store.count("t2") == 1
    row = store.get(("t1", "doc", "a"))
    assert row.document.text == "hello world" and row.version is None and not row.deleted


def test_versions_order_events_and_tombstones_keep_deleted_documents_away(store):
    key = ("t1", "doc", "a")
    assert store.should_apply(key, 3)
    store.put([doc("a", text="v3")], {key: 3})
    assert not store.should_apply(key, 3)  # redelivery
    assert not store.should_apply(key, 2)  # out of order
    assert store.should_apply(key, 4) and store.should_apply(key, None)
    store.tombstone(key, 5)
    assert not store.should_apply(key, 4)
    assert store.count("t1") == 0 and list(store.iter_team("t1")) == []
    assert store.get(key).deleted and store.get(key).document is None
    store.put([doc("a", text="v6")], {key: 6})
    assert [d.text for d in store.iter_team("t1")] == ["v6"]


def test_metadata_survives_the_round_trip(store):
    original = doc("a", title="T", tags=["x", "y"], visibility="confidential", author_id="u1")
    store.put([original])
    assert next(store.iter_team("t1")) == original
    assert store.drop_team("t1") == 1 and store.count("t1") == 0


async def test_the_pipeline_records_indexed_documents_with_their_versions(store):
    from batch_ingest.chunking import Chunker, whitespace_tokens
    from batch_ingest.pipeline import IngestPipeline
    from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeVectorStore

    vectors = FakeVectorStore()
    pipeline = IngestPipeline(
        embedder=FakeEmbedder(dim=8),
        store=vectors,
        graph=FakeGraphStore(),
        chunker=Chunker(whitespace_tokens, 50, 5),
        embed_model="fake@v1",
        sources=store,
    )
    report = await pipeline.ingest([doc("a"), doc("b")], {("t1", "doc", "a"): 7})
    assert not report.failed
    assert store.get(("t1", "doc", "a")).version == 7
    assert store.get(("t1", "doc", "b")).version is None
    # A failed write is not recorded.
    vectors.down = True
    with pytest.raises(BackendUnavailable):
        await pipeline.ingest([doc("c")])
    assert store.get(("t1", "doc", "c")) is None


def test_a_lease_has_one_holder_until_released_or_expired(store):
    a, b = ("t1", "doc", "a"), ("t1", "doc", "b")
    assert store.claim([a, b], "w1", ttl_s=60) == {a, b}
    assert store.claim([a, b], "w2", ttl_s=60) == set()
    assert store.claim([a], "w1", ttl_s=60) == {a}  # the holder may extend it
    store.release([a], "w2")  # not w2's: nothing happens
    assert store.claim([a], "w2", ttl_s=60) == set()
    store.release([a], "w1")
    assert store.claim([a], "w2", ttl_s=60) == {a}
    # An expired lease (a crashed writer) is taken over.
    assert store.claim([("t1", "doc", "c")], "crashed", ttl_s=-1) == {("t1", "doc", "c")}
    assert store.claim([("t1", "doc", "c")], "w2", ttl_s=60) == {("t1", "doc", "c")}


def test_racing_writers_get_a_lease_exactly_once(store):
    from concurrent.futures import ThreadPoolExecutor

    key = ("t1", "doc", "hot")
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: bool(store.claim([key], f"w{i}", 60)), range(16)))
    assert sum(won) == 1
