"""HotIndex (deployments/memindex/cache.py) over an in-memory stand-in for Milvus and its
change log: loading, coherence with writes of other writers, swaps, the budget, failures.
The real Milvus change log is exercised in tests/integration/test_memory_index.py."""

from __future__ import annotations

import itertools
import uuid

import pytest

from deployments.memindex.cache import HotIndex
from deployments.memindex.changes import Change, Heads, now_ms
from deployments.protocols import ChunkRecord, SearchFilter
from deployments.search_filter import compile_filter

TEAM = "t1"


class FakeChanges:
    """The change log's interface over dicts (what ChangeLog keeps in Milvus)."""

    retention_s = 3600.0

    def __init__(self) -> None:
        self.rows: dict[str, list[Change]] = {}
        self.head: dict[str, str] = {}
        self.swap: dict[str, str] = {}
        self.fail = False
        self.clock = itertools.count(now_ms())

    def _check(self) -> None:
        if self.fail:
            raise ConnectionError("milvus down")

    def record(self, alias: str, chunk_ids: list[str], at_ms: int | None = None) -> None:
        change = Change(uuid.uuid4().hex, at_ms or next(self.clock), tuple(chunk_ids))
        self.rows.setdefault(alias, []).append(change)
        self.head[alias] = uuid.uuid4().hex

    def record_swap(self, alias: str) -> None:
        self.swap[alias] = uuid.uuid4().hex

    def heads(self, alias: str) -> Heads:
        self._check()
        return Heads(self.head.get(alias, ""), self.swap.get(alias, ""))

    def since(self, alias: str, at_ms: int) -> list[Change]:
        self._check()
        return sorted(
            (c for c in self.rows.get(alias, []) if c.at_ms >= at_ms), key=lambda c: c.at_ms
        )

    def reset(self) -> None:
        pass


class FakeSource:
    """Physical collections, aliases and a change log, written the way MilvusStore does."""

    dim = 4

    def __init__(self) -> None:
        self.changes = FakeChanges()
        self.collections: dict[str, dict[str, ChunkRecord]] = {}
        self.alias: dict[str, str] = {}
        self.reads = 0
        self.fetched: list[list[str]] = []

    def collection_for(self, team_id: str) -> str:
        return f"rag__{team_id}"

    def live_physical(self, team_id: str) -> str | None:
        return self.alias.get(self.collection_for(team_id))

    def count_team(self, physical: str, team_id: str) -> int:
        return sum(r.team_id == team_id for r in self.collections[physical].values())

    def iter_rows(self, physical: str, team_id: str):
        self.reads += 1
        rows = [r for r in self.collections[physical].values() if r.team_id == team_id]
        for start in range(0, len(rows), 3):
            yield rows[start : start + 3]

    def fetch_rows(self, physical: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        self.fetched.append(list(chunk_ids))
        rows = self.collections[physical]
        return [rows[c] for c in chunk_ids if c in rows]

    # --- writers ---
    def write(self, chunks: list[ChunkRecord], team: str = TEAM) -> None:
        alias = self.collection_for(team)
        physical = self.alias.setdefault(alias, f"{alias}__v1")
        self.collections.setdefault(physical, {}).update({c.chunk_id: c for c in chunks})
        self.changes.record(alias, [c.chunk_id for c in chunks])

    def delete(self, chunk_ids: list[str], team: str = TEAM) -> None:
        alias = self.collection_for(team)
        for cid in chunk_ids:
            self.collections[self.alias[alias]].pop(cid, None)
        self.changes.record(alias, chunk_ids)

    def swap(self, chunks: list[ChunkRecord], version: int, team: str = TEAM) -> None:
        alias = self.collection_for(team)
        physical = f"{alias}__v{version}"
        self.collections[physical] = {c.chunk_id: c for c in chunks}
        self.alias[alias] = physical
        self.changes.record_swap(alias)


def chunk(i: int, text: str = "", team: str = TEAM, **fields) -> ChunkRecord:
    return ChunkRecord(
        chunk_id=f"{team}-c{i}",
        doc_id=f"d{i}",
        team_id=team,
        chunk_index=0,
        text=text or f"chunk number {i} about milvus",
        title="",
        content_hash="h",
        embed_model="m",
        vector=[1.0, float(i), 0.0, 0.5],
        **fields,
    )


FLT = compile_filter(SearchFilter(team_id=TEAM))


def search(hot: HotIndex, query: str = "milvus", flt=FLT, read_id: str = "") -> set[str] | None:
    found = hot.candidates(query, [1.0, 0.0, 0.0, 0.0], flt, 100_000, ("bm25", "dense"), read_id)
    if found is None:
        return None
    assert {h.chunk.chunk_id for h in found["bm25"]} <= {h.chunk.chunk_id for h in found["dense"]}
    return {h.chunk.chunk_id for h in found["dense"]}


@pytest.fixture
def source() -> FakeSource:
    src = FakeSource()
    src.write([chunk(i) for i in range(10)])
    return src


@pytest.fixture
def hot(source: FakeSource):
    index = HotIndex(source, max_mb=64, lookback_s=30)
    yield index
    index.close()


def test_first_search_goes_to_milvus_and_loads_the_team_in_the_background(hot, source):
    assert search(hot) is None
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert search(hot) == {f"{TEAM}-c{i}" for i in range(10)}
    assert hot.status()["chunks"] == 10


def test_a_write_by_another_writer_is_seen_by_the_next_search(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    source.write([chunk(42, "brand new text about milvus")])
    assert f"{TEAM}-c42" in search(hot)
    source.write([chunk(42, "rewritten without the word")])
    found = hot.candidates("rewritten", None, FLT, 10, ("bm25",))
    assert [h.chunk.text for h in found["bm25"]] == ["rewritten without the word"]


def test_a_delete_is_seen_by_the_next_search(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    source.delete([f"{TEAM}-c3", f"{TEAM}-c4"])
    assert search(hot) == {f"{TEAM}-c{i}" for i in range(10) if i not in (3, 4)}


def test_an_unchanged_head_reads_no_change_rows(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    fetched = len(source.fetched)
    for _ in range(5):
        search(hot)
    assert len(source.fetched) == fetched


def test_a_change_committed_late_with_an_earlier_timestamp_is_still_applied(hot, source):
    """A writer took its timestamp before another's but committed after it (within the
    lookback): the reader already moved its watermark past it and must not skip it."""
    hot.wait_loaded(TEAM, timeout_s=10)
    source.write([chunk(50)])
    assert f"{TEAM}-c50" in search(hot)
    late = chunk(51)
    source.collections[source.alias["rag__t1"]][late.chunk_id] = late
    source.changes.record("rag__t1", [late.chunk_id], at_ms=now_ms() - 10_000)
    assert f"{TEAM}-c51" in search(hot)


def test_a_reindex_swap_reloads_the_team_and_never_answers_from_the_old_copy(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    source.swap([chunk(100), chunk(101)], version=2)
    assert search(hot) is None  # not the old rows: Milvus answers until the reload
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert search(hot) == {f"{TEAM}-c100", f"{TEAM}-c101"}


def test_a_change_log_failure_falls_back_to_milvus_and_recovers(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    source.changes.fail = True
    assert search(hot) is None
    source.changes.fail = False
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert len(search(hot)) == 10


def test_second_call_of_one_search_skips_the_check_but_a_new_search_does_not(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    assert search(hot, read_id="r1") is not None
    source.changes.fail = True  # a check now would fail
    assert search(hot, read_id="r1") is not None  # same search: checked already
    assert search(hot, read_id="r2") is None  # a new search checks (and falls back)


def test_other_teams_rows_in_a_shared_collection_never_enter_the_index(source):
    hot = HotIndex(source, max_mb=64)
    other = chunk(7, team="t2")
    alias = source.collection_for(TEAM)
    # The "shared" layout: one physical collection holds both teams.
    source.collections[source.alias[alias]][other.chunk_id] = other
    source.changes.record(alias, [other.chunk_id])
    hot.wait_loaded(TEAM, timeout_s=10)
    assert other.chunk_id not in search(hot)
    hot.close()


def test_a_team_over_the_budget_is_never_cached(source):
    hot = HotIndex(source, max_mb=0.001)
    assert search(hot) is None
    assert not hot.wait_loaded(TEAM, timeout_s=1)
    assert search(hot) is None
    hot.close()


def test_the_least_recently_searched_team_is_evicted_first(source):
    for team in ("t2", "t3"):
        source.write([chunk(i, team=team) for i in range(10)], team=team)
    hot = HotIndex(source, max_mb=64)
    for team in (TEAM, "t2"):
        assert hot.wait_loaded(team, timeout_s=10)
    one_team = max(t.index.nbytes for t in hot._teams.values())
    hot.budget = int(2.5 * one_team)
    search(hot)  # TEAM is now more recent than t2
    assert hot.wait_loaded("t3", timeout_s=10)
    assert set(hot._teams) == {TEAM, "t3"}
    assert hot.stats["evictions"] == 1
    hot.close()


def test_a_large_change_set_reloads_instead_of_replaying(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    reads = source.reads
    source.write([chunk(i) for i in range(1000, 1000 + 6000)])
    assert search(hot) is None
    assert hot.wait_loaded(TEAM, timeout_s=30)
    assert source.reads == reads + 1
    assert len(search(hot)) == 6010


def test_synced_candidates_answer_only_a_search_already_checked(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    args = ("milvus", [1.0, 0.0, 0.0, 0.0], FLT, 5, ("dense",))
    assert hot.synced_candidates(*args, "r9") is None  # not checked yet: no answer
    assert hot.candidates(*args, "r9") is not None
    source.write([chunk(77)])  # a write after that check belongs to a later search
    assert hot.synced_candidates(*args, "r9") is not None
    assert hot.synced_candidates(*args, "") is None
    assert f"{TEAM}-c77" in search(hot, read_id="r10")
