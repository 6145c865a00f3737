"""The Retriever's in-memory index against the real Milvus Lite server: it answers like Milvus,
and a search after an acknowledged write, delete or reindex swap by *another* writer (its own
client, as the bus consumer or a reindex job has) sees it."""

from __future__ import annotations

import queue
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from batch_ingest.generations import IndexGenerations
from deployments.protocols import SearchFilter
from deployments.vector_store.deployment import RetrieverDeployment
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.front import MemoryFront
from deployments.vector_store.memindex.hot import HotIndex
from deployments.vector_store.store import MilvusStore
from serve_app.settings import GatewaySettings
from tests.integration.test_milvus_store import chunk, vec

pytestmark = pytest.mark.integration

WORDS = ["milvus", "graph", "tenant", "vector", "search", "agent", "ray", "neo4j", "chunk"]


def corpus(team: str, n: int = 40):
    """``n`` chunks of distinct texts (distinct vectors: no ties between the two paths)."""
    return [
        chunk(
            team,
            f"doc{i}",
            0,
            text=" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 1 + i % 7 + 2))
            + f" item{i}",
        )
        for i in range(n)
    ]


@pytest.fixture
def stores(settings: GatewaySettings):
    """A writer and a reader on their own connections, one base collection per test."""
    milvus = settings.milvus.model_copy(update={"collection": f"mi_{uuid.uuid4().hex[:10]}"})
    writer, reader = MilvusStore(milvus, dim=384), MilvusStore(milvus, dim=384)
    writer.start()
    reader.start()
    yield writer, reader
    writer.drop()
    writer.close()
    reader.close()


@pytest.fixture
def team() -> str:
    return f"team_{uuid.uuid4().hex[:8]}"


def hot_over(reader: MilvusStore) -> HotIndex:
    s = reader.settings
    return HotIndex(reader.versions, metric=s.metric_type, k1=s.bm25_k1, b=s.bm25_b)


def ids(found, method: str = "dense") -> list[str]:
    return [h.chunk.chunk_id for h in found[method]]


def test_change_log_heads_and_rows_round_trip(stores):
    writer, _ = stores
    log = writer.changes
    alias = writer.collection_for("t")
    empty = log.heads(alias)
    log.record(alias, ["a", "b"])
    after = log.heads(alias)
    assert after.rows and after.rows != empty.rows and after.swap == empty.swap
    log.record_swap(alias)
    assert log.heads(alias).swap != after.swap
    changes = log.since(alias, 0)
    assert [c.chunk_ids for c in changes] == [("a", "b")]
    assert log.since(alias, changes[0].at_ms + 1) == []


def test_memory_index_scores_equal_milvus_on_a_flushed_collection(stores, team):
    writer, reader = stores
    rows = corpus(team)
    writer.upsert(rows)
    writer.flush(team)
    hot = hot_over(reader)
    assert hot.wait_loaded(team, timeout_s=60)
    flt = SearchFilter(team_id=team)
    for query in ("milvus graph", "tenant vector agent", "ray"):
        vector = vec(query)
        found = hot.candidates(query, vector, compile_filter(flt), 10, ("dense", "bm25"))
        dense = reader.search(query, vector, flt, 10, "dense")
        bm25 = reader.search(query, None, flt, 10, "bm25")
        assert ids(found) == [h.chunk.chunk_id for h in dense]
        assert [h.score for h in found["dense"]] == pytest.approx(
            [h.score for h in dense], abs=1e-5
        )
        # Same BM25 function and parameters (k1, b set on the collection); ties may order
        # differently, so compare the scores rank by rank and the sets of ids.
        assert [h.score for h in found["bm25"]] == pytest.approx([h.score for h in bm25], rel=1e-4)
        assert set(ids(found, "bm25")) == {h.chunk.chunk_id for h in bm25} or len(bm25) == 10
    hot.close()


def test_search_after_acknowledged_upsert_delete_and_rewrite_by_another_writer(stores, team):
    writer, reader = stores
    writer.upsert(corpus(team, 10))
    hot = hot_over(reader)
    assert hot.wait_loaded(team, timeout_s=60)
    flt = compile_filter(SearchFilter(team_id=team))

    new = chunk(team, "fresh", 0, text="zebra quagga okapi")
    writer.upsert([new])
    found = hot.candidates("zebra", vec("zebra"), flt, 5, ("bm25",))
    assert ids(found, "bm25") == [new.chunk_id]

    writer.upsert([chunk(team, "fresh", 0, text="rewritten without animals")])
    assert hot.candidates("zebra", None, flt, 5, ("bm25",))["bm25"] == []

    writer.delete_chunks(team, [new.chunk_id])
    assert new.chunk_id not in ids(hot.candidates("x", vec("x"), flt, 100, ("dense",)))
    assert hot.stats["hits"] == 3 and hot.stats["misses"] == 0
    hot.close()


def test_reindex_swap_is_seen_by_the_next_search(stores, team):
    writer, reader = stores
    writer.upsert(corpus(team, 10))
    hot = hot_over(reader)
    assert hot.wait_loaded(team, timeout_s=60)
    flt = compile_filter(SearchFilter(team_id=team))

    physical = writer.versions.create(team, 2)
    only = chunk(team, "v2only", 0, text="only in version two")
    writer.versions.upsert(physical, [only])  # not live yet: nobody's to see
    assert only.chunk_id not in ids(hot.candidates("two", vec("two"), flt, 100, ("dense",)))
    writer.versions.flush(physical)
    writer.versions.switch(team, 2)
    # Never the old copy: Milvus answers until the team is loaded again.
    assert hot.candidates("two", vec("two"), flt, 100, ("dense",)) is None
    assert hot.wait_loaded(team, timeout_s=60)
    assert ids(hot.candidates("two", vec("two"), flt, 100, ("dense",))) == [only.chunk_id]

    # A reindex catching up after the swap writes the now-live version directly.
    late = chunk(team, "late", 0, text="caught up after the swap")
    writer.versions.upsert(physical, [late])
    assert late.chunk_id in ids(hot.candidates("x", vec("x"), flt, 100, ("dense",)))
    writer.versions.delete(physical, [late.chunk_id])
    assert late.chunk_id not in ids(hot.candidates("x", vec("x"), flt, 100, ("dense",)))
    hot.close()


def test_every_acknowledged_write_is_found_by_a_search_right_after_it(stores, team):
    """A writer thread acknowledges documents one by one; after each acknowledgement the
    reader searches for it at once. Every one must be found (no window of staleness)."""
    writer, reader = stores
    writer.upsert(corpus(team, 5))
    hot = hot_over(reader)
    assert hot.wait_loaded(team, timeout_s=60)
    flt = compile_filter(SearchFilter(team_id=team))
    acked: queue.Queue = queue.Queue()

    def write() -> None:
        for i in range(25):
            c = chunk(team, f"live{i}", 0, text=f"unique{i}word appears here")
            writer.upsert([c])
            acked.put((f"unique{i}word", c.chunk_id))
        acked.put(None)

    thread = threading.Thread(target=write)
    thread.start()
    missed = []
    while (item := acked.get(timeout=60)) is not None:
        word, chunk_id = item
        found = hot.candidates(word, None, flt, 5, ("bm25",))
        if found is None or ids(found, "bm25")[:1] != [chunk_id]:
            missed.append(word)
    thread.join()
    assert missed == []
    hot.close()


def test_shared_collection_memory_index_keeps_teams_apart(settings: GatewaySettings):
    milvus = settings.milvus.model_copy(
        update={"collection": f"mis_{uuid.uuid4().hex[:10]}", "layout": "shared"}
    )
    writer, reader = MilvusStore(milvus, dim=384), MilvusStore(milvus, dim=384)
    writer.start()
    reader.start()
    try:
        a, b = "team_a_" + uuid.uuid4().hex[:6], "team_b_" + uuid.uuid4().hex[:6]
        writer.upsert(corpus(a, 8) + corpus(b, 8))
        hot = hot_over(reader)
        assert hot.wait_loaded(a, timeout_s=60)
        writer.upsert([chunk(b, "bonly", 0, text="milvus graph tenant")])  # another team's write
        for team in (a,):
            found = hot.candidates(
                "milvus graph",
                vec("milvus"),
                compile_filter(SearchFilter(team_id=team)),
                100,
                ("dense", "bm25"),
            )
            assert found is not None
            assert {h.chunk.team_id for m in found.values() for h in m} == {team}
        hot.close()
    finally:
        writer.drop()
        writer.close()
        reader.close()


async def test_retriever_deployment_answers_from_memory_once_loaded(stores, team):
    writer, _ = stores
    writer.upsert(corpus(team, 12))
    retriever = RetrieverDeployment(writer.settings, 384)
    flt = SearchFilter(team_id=team)
    before = await retriever.candidates("milvus", vec("milvus"), flt, 5, ("dense", "bm25"))
    assert retriever.hot is not None and retriever.hot.stats["misses"] == 1
    assert retriever.hot.wait_loaded(team, timeout_s=60)
    after = await retriever.candidates("milvus", vec("milvus"), flt, 5, ("dense", "bm25"))
    assert retriever.hot.stats["hits"] == 1
    assert ids(after) == ids(before)  # exact dense vs HNSW on a small collection: the same
    status = await retriever.status()
    assert status["memory_index"]["chunks"] == 12
    off = RetrieverDeployment(
        writer.settings.model_copy(
            update={
                "memory_index": writer.settings.memory_index.model_copy(update={"enabled": False})
            }
        ),
        384,
    )
    assert off.hot is None
    assert (await off.status())["memory_index"] == {"enabled": False}
    retriever.hot.close()
    time.sleep(0)


def test_memory_index_applies_document_acls_like_milvus(stores, team):
    """ACL'd rows loaded from Milvus and a re-permission by another writer: the in-memory
    index admits exactly the chunks Milvus's own filter admits, for every caller."""
    from dataclasses import replace

    from deployments.acl import principal_tokens
    from tests.integration.test_milvus_acl import CALLERS, acl_rows

    writer, reader = stores
    rows = acl_rows(team)
    writer.upsert(rows)
    writer.flush(team)
    hot = hot_over(reader)
    assert hot.wait_loaded(team, timeout_s=60)

    def agree() -> None:
        for caller, _ in CALLERS:
            flt = SearchFilter(team_id=team, acl_principals=principal_tokens(*caller))
            query = f"{team} budget"
            found = hot.candidates(query, vec(query), compile_filter(flt), 10, ("dense", "bm25"))
            assert found is not None
            for method in ("dense", "bm25"):
                milvus = reader.search(query, vec(query), flt, 10, method)
                assert set(ids(found, method)) == {h.chunk.chunk_id for h in milvus}, caller

    agree()
    # Another writer re-permissions the open document to hr only.
    writer.upsert([replace(rows[0], acl_allow=("group:hr",))])
    agree()
    outsider = SearchFilter(team_id=team, acl_principals=principal_tokens("carol", []))
    found = hot.candidates("open notes", vec("open notes"), compile_filter(outsider), 10, ("bm25",))
    assert rows[0].chunk_id not in ids(found, "bm25")
    hot.close()


def team_rows(reader: MilvusStore, physical: str, team: str) -> dict[str, tuple[str, tuple]]:
    """``chunk_id → (text, acl_allow)`` of every row of ``team`` in ``physical`` (Milvus)."""
    return {
        c.chunk_id: (c.text, tuple(c.acl_allow))
        for batch in reader.versions.iter_rows(physical, team)
        for c in batch
    }


def memory_rows(hot: HotIndex, team: str, principals: tuple[str, ...]) -> dict[str, tuple]:
    flt = compile_filter(SearchFilter(team_id=team, acl_principals=principals))
    found = hot.candidates("x", vec("x"), flt, 10_000, ("dense",))
    assert found is not None
    return {h.chunk.chunk_id: (h.chunk.text, tuple(h.chunk.acl_allow)) for h in found["dense"]}


def test_announced_version_answers_the_first_search_after_the_switch(stores, team):
    """Issue 33: a team in memory; a reindex builds v2, announces it; its final catch-up
    writes into v2 (an upsert, a delete, an ACL change) before the switch, live writes land
    in the alias after it. The very next search after ``switch`` is answered from memory
    (a hit, no miss, no reload) with exactly v2's content, those writes included."""
    from dataclasses import replace

    from deployments.acl import OPEN, principal_tokens

    writer, reader = stores
    old = corpus(team, 20)
    writer.upsert(old)
    hot = hot_over(reader)
    assert hot.wait_loaded(team, timeout_s=60)
    flt = compile_filter(SearchFilter(team_id=team))

    physical = writer.versions.create(team, 2)
    rebuilt = [replace(c, text=c.text + " rebuilt", vector=vec(c.text + " rebuilt")) for c in old]
    writer.versions.upsert(physical, rebuilt)
    writer.versions.flush(physical)
    writer.versions.announce(team, 2)
    assert hot.candidates("milvus", vec("milvus"), flt, 10, ("dense", "bm25")) is not None
    assert hot.staging.wait(team, physical, timeout_s=60)

    # The final catch-up, into the target before the switch.
    added = chunk(team, "added", 0, text="added during the catch up")
    hr_only = replace(rebuilt[1], acl_allow=("group:hr",))
    writer.versions.upsert(physical, [added, hr_only])
    writer.versions.delete(physical, [rebuilt[2].chunk_id])
    writer.upsert([chunk(team, "live_before", 0, text="live write to the old version")])
    writer.versions.switch(team, 2)
    # After the switch: live writes through the alias, and the job's last catch-up.
    after = chunk(team, "after", 0, text="written after the switch")
    writer.upsert([after])
    writer.delete_chunks(team, [rebuilt[3].chunk_id])
    late = chunk(team, "late", 0, text="caught up after the switch")
    writer.versions.upsert(physical, [late])

    stats = dict(hot.stats)
    everyone = principal_tokens("alice", ["hr"])
    in_memory = memory_rows(hot, team, everyone)
    assert hot.stats["hits"] == stats["hits"] + 1
    assert hot.stats["misses"] == stats["misses"] and hot.stats["loads"] == stats["loads"]
    assert hot.stats["adoptions"] == 1 and hot.status()["loading"] == []
    assert in_memory == team_rows(reader, physical, team)
    assert added.chunk_id in in_memory and late.chunk_id in in_memory
    assert after.chunk_id in in_memory
    assert rebuilt[2].chunk_id not in in_memory and rebuilt[3].chunk_id not in in_memory
    assert in_memory[hr_only.chunk_id][1] == ("group:hr",)
    assert hr_only.chunk_id not in memory_rows(hot, team, (OPEN,))
    assert not any(text.endswith("item0") for text, _ in in_memory.values())  # no v1 text
    hot.close()


def test_withdrawn_announcement_drops_the_staged_copy(stores, team):
    writer, reader = stores
    writer.upsert(corpus(team, 5))
    hot = hot_over(reader)
    assert hot.wait_loaded(team, timeout_s=60)
    flt = compile_filter(SearchFilter(team_id=team))
    physical = writer.versions.create(team, 2)
    writer.versions.upsert(physical, [chunk(team, "v2", 0, text="version two")])
    writer.versions.announce(team, 2)
    hot.candidates("x", vec("x"), flt, 10, ("dense",))
    assert hot.staging.wait(team, physical, timeout_s=60)
    writer.versions.drop(team, 2)  # the failed job cleans up: withdraws it too
    assert writer.changes.announced(writer.collection_for(team)) == ""
    assert len(ids(hot.candidates("x", vec("x"), flt, 10, ("dense",)))) == 5
    assert hot.status()["staged"] == {}
    # Writes into a version nobody announced are not recorded.
    other = writer.versions.create(team, 3)
    before = writer.changes.since((writer.collection_for(team), other), 0)
    writer.versions.upsert(other, [chunk(team, "v3", 0)])
    assert writer.changes.since((writer.collection_for(team), other), 0) == before
    hot.close()


async def test_one_search_reads_one_version_when_the_swap_lands_between_its_calls(stores, team):
    """Item 7 of issue 33: the Milvus path searches each method in its own call. A switch
    that lands after the dense call read the collection and before the BM25 call does made
    one search fuse v1's dense list with v2's BM25 list (documents neither version gives)."""
    writer, _ = stores
    v1 = corpus(team, 10)
    writer.upsert(v1)
    physical = writer.versions.create(team, 2)
    v2 = [chunk(team, f"new{i}", 0, text=f"milvus graph version two {i}") for i in range(10)]
    writer.versions.upsert(physical, v2)
    writer.versions.flush(physical)
    off = writer.settings.memory_index.model_copy(update={"enabled": False})
    retriever = RetrieverDeployment(writer.settings.model_copy(update={"memory_index": off}), 384)
    store = retriever.store
    dense_done = threading.Event()
    search = store.search

    def racing_search(*args, **kw):
        mode = args[4] if len(args) > 4 else kw.get("mode", "dense")
        if mode == "bm25":  # the swap lands while the dense call runs
            dense_done.wait(10)
            writer.versions.switch(team, 2)
        try:
            return search(*args, **kw)
        finally:
            if mode == "dense":
                dense_done.set()

    store.search = racing_search  # type: ignore[method-assign]
    found = await retriever.candidates(
        "milvus graph", vec("milvus graph"), SearchFilter(team_id=team), 20, ("dense", "bm25"), "r1"
    )
    read = {h.chunk.chunk_id for hits in found.values() for h in hits}
    versions = [
        name for name, rows in (("v1", v1), ("v2", v2)) if read & {c.chunk_id for c in rows}
    ]
    assert versions == ["v1"], found
    store.search = search  # type: ignore[method-assign]
    found = await retriever.candidates(
        "milvus graph", vec("milvus graph"), SearchFilter(team_id=team), 20, ("dense", "bm25"), "r2"
    )
    assert {h.chunk.chunk_id for hits in found.values() for h in hits} <= {c.chunk_id for c in v2}
    retriever.store.close()


def counting_heads(hot: HotIndex) -> list[str]:
    """Record every change-log heads read ``hot`` makes."""
    changes = hot.source.changes
    reads: list[str] = []
    real = changes.heads

    def heads(alias: str):
        reads.append(alias)
        return real(alias)

    changes.heads = heads  # type: ignore[method-assign]
    return reads


def test_an_unchanged_generation_skips_the_change_log_and_every_write_is_still_found(
    stores, team, tmp_path
):
    """Issue 37: a search that brings its team's index generation (read after it arrived, as
    the gateway reads it for the semantic cache) skips the heads read while nothing was
    written. The writer raises the generation after each write, before acknowledging, as
    every writer of the gateway does (batch_ingest/pipeline.py): every acknowledged write is
    still found by the search right after it."""
    writer, reader = stores
    generations = IndexGenerations(sa.create_engine(f"sqlite:///{tmp_path / 'state.db'}"))
    writer.upsert(corpus(team, 5))
    generations.bump([team])
    s = reader.settings
    hot = HotIndex(
        reader.versions, metric=s.metric_type, k1=s.bm25_k1, b=s.bm25_b, generation_trust_s=30
    )
    assert hot.wait_loaded(team, timeout_s=60)
    flt = compile_filter(SearchFilter(team_id=team))
    reads = counting_heads(hot)
    acked: queue.Queue = queue.Queue()

    def write() -> None:
        for i in range(15):
            c = chunk(team, f"gen{i}", 0, text=f"genword{i} appears here")
            writer.upsert([c])
            generations.bump([team])
            acked.put((f"genword{i}", c.chunk_id))
        acked.put(None)

    thread = threading.Thread(target=write)
    thread.start()
    missed, skipped = [], 0
    while (item := acked.get(timeout=60)) is not None:
        word, chunk_id = item
        generation = generations.get(team)  # after the acknowledgement, as a search would
        found = hot.candidates(word, None, flt, 5, ("bm25",), uuid.uuid4().hex, generation)
        if found is None or ids(found, "bm25")[:1] != [chunk_id]:
            missed.append(word)
        # Again, the generation unchanged unless the writer raised it meanwhile.
        before = len(reads)
        again = hot.candidates(word, None, flt, 5, ("bm25",), uuid.uuid4().hex, generation)
        assert again is not None and ids(again, "bm25")[:1] == [chunk_id]
        skipped += len(reads) == before
    thread.join()
    assert missed == []
    # More skips than the repeats when the writer ran ahead: a search read a generation
    # the last check had already covered.
    assert skipped == 15 and hot.stats["generation_checks"] >= 15
    hot.close()


def test_the_generation_is_trusted_for_generation_trust_s_only(stores, team, tmp_path):
    """A write whose generation raise failed (its response says so) is found once the trust
    window after the last check has passed; with no window, every search reads the log."""
    writer, reader = stores
    writer.upsert(corpus(team, 5))
    s = reader.settings
    flt = compile_filter(SearchFilter(team_id=team))
    for trust in (0.0, 0.3):
        hot = HotIndex(
            reader.versions,
            metric=s.metric_type,
            k1=s.bm25_k1,
            b=s.bm25_b,
            generation_trust_s=trust,
        )
        assert hot.wait_loaded(team, timeout_s=60)
        reads = counting_heads(hot)
        assert hot.candidates("item1", None, flt, 5, ("bm25",), "a", 7) is not None
        late = chunk(team, f"late{trust}", 0, text=f"unraised{int(trust * 10)} marker")
        writer.upsert([late])  # acknowledged, but the generation stays 7
        if trust:
            time.sleep(trust + 0.1)
        found = hot.candidates(f"unraised{int(trust * 10)}", None, flt, 5, ("bm25",), "b", 7)
        assert found is not None and ids(found, "bm25") == [late.chunk_id]
        assert len(reads) == 2 and hot.stats["generation_checks"] == 0
        hot.close()


async def test_memory_front_answers_a_fresh_generation_on_the_loop(stores, team):
    """The Ingress's path: with the generation unchanged the front makes no thread hop and
    no Milvus read; another generation reads the log again."""
    writer, reader = stores
    writer.upsert(corpus(team, 5))
    s = reader.settings
    hot = HotIndex(
        reader.versions, metric=s.metric_type, k1=s.bm25_k1, b=s.bm25_b, generation_trust_s=30
    )
    assert hot.wait_loaded(team, timeout_s=60)
    front = MemoryFront(hot)
    reads = counting_heads(hot)
    flt = SearchFilter(team_id=team)
    assert await front.answer("item2", None, flt, 5, ("bm25",), "r1", 3) is not None
    assert len(reads) == 1
    assert await front.answer("item2", None, flt, 5, ("bm25",), "r2", 3) is not None
    assert len(reads) == 1 and hot.stats["generation_checks"] == 1
    assert await front.answer("item2", None, flt, 5, ("bm25",), "r3", 4) is not None
    assert len(reads) == 2
    assert await front.answer("item2", None, flt, 5, ("bm25",), "r4") is not None
    assert len(reads) == 3, "a search without a generation must read the log"
    hot.close()
