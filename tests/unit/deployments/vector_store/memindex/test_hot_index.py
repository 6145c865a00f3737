"""HotIndex (deployments/vector_store/memindex/hot.py) over an in-memory stand-in for Milvus and its
change log: loading, coherence with writes of other writers, swaps, the budget, failures.
The real Milvus change log is exercised in tests/integration/test_memory_index.py."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from deployments.protocols import ChunkRecord, SearchFilter
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.changes import Change, Heads, now_ms
from deployments.vector_store.memindex.hot import HotIndex

TEAM = "t1"


class FakeChanges:
    """The change log's interface over dicts (what ChangeLog keeps in Milvus)."""

    retention_s = 3600.0

    def __init__(self) -> None:
        self.rows: dict[str, list[Change]] = {}
        self.head: dict[str, str] = {}
        self.swap: dict[str, str] = {}
        self.next: dict[str, tuple[str, str]] = {}  # alias → (physical, token)
        self.fail = False
        self.clock = itertools.count(now_ms())

    def _check(self) -> None:
        if self.fail:
            raise ConnectionError("milvus down")

    def record(
        self, alias: str, chunk_ids: list[str], at_ms: int | None = None, name: str = ""
    ) -> None:
        change = Change(uuid.uuid4().hex, at_ms or next(self.clock), tuple(chunk_ids))
        self.rows.setdefault(name or alias, []).append(change)
        self.head[alias] = uuid.uuid4().hex

    def record_swap(self, alias: str) -> None:
        self.swap[alias] = uuid.uuid4().hex
        self.next[alias] = ("", uuid.uuid4().hex)

    def announce(self, alias: str, physical: str) -> None:
        self.next[alias] = (physical, uuid.uuid4().hex)

    def withdraw(self, alias: str) -> None:
        self.next[alias] = ("", uuid.uuid4().hex)

    def heads(self, alias: str) -> Heads:
        self._check()
        nxt, token = self.next.get(alias, ("", ""))
        return Heads(self.head.get(alias, ""), self.swap.get(alias, ""), nxt, token)

    def since(self, names: str | tuple[str, ...], at_ms: int) -> list[Change]:
        self._check()
        wanted = (names,) if isinstance(names, str) else names
        found = [c for n in wanted for c in self.rows.get(n, []) if c.at_ms >= at_ms]
        return sorted(found, key=lambda c: c.at_ms)

    def reset(self) -> None:
        pass


class FakeSource:
    """Physical collections, aliases and a change log, written the way MilvusStore and
    CollectionVersions do."""

    dim = 4

    def __init__(self) -> None:
        self.changes = FakeChanges()
        self.collections: dict[str, dict[str, ChunkRecord]] = {}
        self.alias: dict[str, str] = {}
        self.reads = 0
        self.read_physicals: list[str] = []
        self.fetched: list[list[str]] = []
        self.dims: dict[str, int] = {}  # a version of another model's vector size

    def collection_for(self, team_id: str) -> str:
        return f"rag__{team_id}"

    def live_physical(self, team_id: str) -> str | None:
        return self.alias.get(self.collection_for(team_id))

    @property
    def shapes(self) -> FakeSource:  # dim_of, as the store's CollectionShapes answers it
        return self

    def dim_of(self, physical: str) -> int:
        return self.dims.get(physical, self.dim)

    def count_team(self, physical: str, team_id: str) -> int:
        return sum(r.team_id == team_id for r in self.collections[physical].values())

    def iter_rows(self, physical: str, team_id: str):
        self.reads += 1
        self.read_physicals.append(physical)
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

    # --- a reindex job, as CollectionVersions records it ---
    def build(self, chunks: list[ChunkRecord], version: int, team: str = TEAM) -> str:
        physical = f"{self.collection_for(team)}__v{version}"
        self.collections[physical] = {c.chunk_id: c for c in chunks}
        return physical

    def write_physical(
        self, physical: str, chunks: list[ChunkRecord] = (), deleted: list[str] = ()
    ) -> None:
        alias = physical.rpartition("__v")[0]
        rows = self.collections[physical]
        rows.update({c.chunk_id: c for c in chunks})
        for cid in deleted:
            rows.pop(cid, None)
        ids = [c.chunk_id for c in chunks] + list(deleted)
        if self.alias.get(alias) == physical:
            self.changes.record(alias, ids)
        elif self.changes.next.get(alias, ("", ""))[0] == physical:
            self.changes.record(alias, ids, name=physical)

    def announce(self, physical: str) -> None:
        self.changes.announce(physical.rpartition("__v")[0], physical)

    def switch(self, physical: str) -> None:
        alias = physical.rpartition("__v")[0]
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
    one_team = max(t.index.nbytes for t in hot._teams.teams())
    hot.budget = int(2.5 * one_team)
    search(hot)  # TEAM is now more recent than t2
    assert hot.wait_loaded("t3", timeout_s=10)
    assert set(hot._teams) == {TEAM, "t3"}
    assert hot.status()["evictions"] == 1
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


# --- concurrent searches share one read of the change log --------------------------------
class GatedHeads:
    """``heads`` of ``changes`` that counts its reads and, while ``gate`` is clear, holds
    each read until it is set (so searches pile up behind the team's lock)."""

    def __init__(self, changes: FakeChanges) -> None:
        self.changes = changes
        self.reads = 0
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, alias: str) -> Heads:
        self.reads += 1
        self.entered.set()
        assert self.gate.wait(10)
        return FakeChanges.heads(self.changes, alias)


def gated(source: FakeSource) -> GatedHeads:
    heads = GatedHeads(source.changes)
    source.changes.heads = heads  # type: ignore[method-assign]
    return heads


def test_searches_waiting_behind_a_check_share_the_next_one(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    heads = gated(source)
    heads.gate.clear()
    first = threading.Thread(target=search, args=(hot,), kwargs={"read_id": "first"})
    first.start()
    assert heads.entered.wait(10)  # the first check is reading; the write below is after it
    source.write([chunk(60, "written while a check was running")])
    with ThreadPoolExecutor(8) as pool:
        waiting = [pool.submit(search, hot, read_id=f"r{i}") for i in range(8)]
        time.sleep(0.2)  # all eight queue behind the first check
        heads.gate.set()
        answers = [f.result(timeout=10) for f in waiting]
    first.join(10)
    # None of the eight may take the running check's answer (it began before they
    # arrived, and before the write); one new check covers them all.
    assert all(f"{TEAM}-c60" in a for a in answers)
    assert heads.reads == 2
    assert hot.stats["shared_checks"] == 7


def test_a_search_arriving_after_a_check_began_does_not_reuse_it(hot, source):
    hot.wait_loaded(TEAM, timeout_s=10)
    heads = gated(source)
    heads.gate.clear()
    first = threading.Thread(target=search, args=(hot,), kwargs={"read_id": "first"})
    first.start()
    assert heads.entered.wait(10)
    source.write([chunk(61)])  # acknowledged after the running check began
    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(search, hot, read_id="later")
        time.sleep(0.1)
        heads.gate.set()
        assert f"{TEAM}-c61" in later.result(timeout=10)
    first.join(10)
    assert heads.reads == 2
    assert hot.stats["shared_checks"] == 0


# --- a reindex that announces its version: staged before the swap, adopted at it ---------
V2 = "rag__t1__v2"


def staged_after_announcement(hot: HotIndex, source: FakeSource, chunks) -> str:
    """Load the team, build v2 from ``chunks``, announce it and let a search notice it."""
    assert hot.wait_loaded(TEAM, timeout_s=10)
    physical = source.build(chunks, version=2)
    source.announce(physical)
    assert search(hot) is not None  # the live copy answers; the announcement is noticed
    assert hot.staging.wait(TEAM, physical, timeout_s=10)
    return physical


def test_an_announced_version_is_staged_and_answers_right_after_the_swap(hot, source):
    physical = staged_after_announcement(hot, source, [chunk(i) for i in range(100, 110)])
    # The job's final catch-up writes into the target before the switch: a new chunk, a
    # delete, an ACL change; a live write reaches the old version meanwhile.
    source.write_physical(
        physical,
        [chunk(110), chunk(101, acl_allow=("group:hr",))],
        deleted=[f"{TEAM}-c102"],
    )
    source.write([chunk(55)])
    assert search(hot) == {f"{TEAM}-c{i}" for i in [*range(10), 55]}  # still the old version
    source.switch(physical)
    source.write_physical(physical, [chunk(111)])  # caught up after the switch (live: alias)
    hits, misses, reads = hot.stats["hits"], hot.stats["misses"], source.reads
    # The ACL change came with it: chunk 101 is hr's only now.
    assert search(hot) == {f"{TEAM}-c{i}" for i in (100, *range(103, 112))}
    assert hot.stats["hits"] == hits + 1 and hot.stats["misses"] == misses
    assert source.reads == reads  # adopted, not read again
    assert hot.stats["adoptions"] == 1 and hot.status()["staged"] == {}
    hr = compile_filter(SearchFilter(team_id=TEAM, acl_principals=("*", "group:hr")))
    assert f"{TEAM}-c101" in search(hot, flt=hr)


def test_a_write_recorded_under_the_physical_after_the_adoption_is_still_seen(hot, source):
    """A slow writer that saw the announcement records under the physical's name after the
    swap: the adopted copy follows that name too."""
    physical = staged_after_announcement(hot, source, [chunk(i) for i in range(100, 105)])
    source.switch(physical)
    assert search(hot) == {f"{TEAM}-c{i}" for i in range(100, 105)}
    source.collections[physical][f"{TEAM}-c120"] = chunk(120)
    source.changes.record("rag__t1", [f"{TEAM}-c120"], name=physical)
    assert f"{TEAM}-c120" in search(hot)


def test_a_withdrawn_announcement_drops_the_staged_copy_and_the_swap_reloads(hot, source):
    physical = staged_after_announcement(hot, source, [chunk(i) for i in range(100, 105)])
    source.changes.withdraw("rag__t1")
    assert search(hot) is not None
    assert hot.status()["staged"] == {} and hot.staging.stats["stage_drops"] == 1
    source.switch(physical)  # a later run switched anyway: behave as without staging
    assert search(hot) is None
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert search(hot) == {f"{TEAM}-c{i}" for i in range(100, 105)}
    assert hot.stats["adoptions"] == 0


def test_a_staged_copy_of_another_version_is_not_adopted(hot, source):
    staged_after_announcement(hot, source, [chunk(i) for i in range(100, 105)])
    source.swap([chunk(300)], version=3)  # another job swapped to v3
    assert search(hot) is None
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert search(hot) == {f"{TEAM}-c300"}
    assert hot.stats["adoptions"] == 0 and hot.status()["staged"] == {}


def test_an_announced_version_that_was_dropped_is_not_staged_and_breaks_nothing(hot, source):
    assert hot.wait_loaded(TEAM, timeout_s=10)
    source.announce("rag__t1__v9")  # the job failed and its version is gone
    for _ in range(3):
        assert len(search(hot)) == 10
    time.sleep(0.3)  # the failed staging ran in the background
    assert hot.status()["staged"] == {} and hot.status()["staging"] == []
    source.write([chunk(60)])
    assert f"{TEAM}-c60" in search(hot)


def test_a_team_loaded_after_the_announcement_stages_it_too(hot, source):
    physical = source.build([chunk(200)], version=2)
    source.announce(physical)
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert hot.staging.wait(TEAM, physical, timeout_s=10)
    source.switch(physical)
    assert search(hot) == {f"{TEAM}-c200"}


def test_a_staged_copy_is_replayed_in_the_background_before_the_swap(hot, source):
    physical = staged_after_announcement(hot, source, [chunk(i) for i in range(100, 105)])
    source.write_physical(physical, [chunk(130)])
    assert search(hot) is not None  # a new head: the staged copy replays in the background
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(f"{TEAM}-c130" in f for f in source.fetched):
        time.sleep(0.02)
    assert any(f"{TEAM}-c130" in f for f in source.fetched)
    fetched = len(source.fetched)
    source.switch(physical)
    assert f"{TEAM}-c130" in search(hot)
    assert len(source.fetched) == fetched  # nothing left to fetch at the swap


def test_the_staged_copy_counts_toward_the_budget(source):
    source.write([chunk(i, team="t2") for i in range(10)], team="t2")
    hot = HotIndex(source, max_mb=64)
    for team in ("t2", TEAM):
        assert hot.wait_loaded(team, timeout_s=10)
    one_team = max(t.index.nbytes for t in hot._teams.teams())
    hot.budget = int(2.5 * one_team)  # two teams fit, not three copies
    physical = staged_after_announcement(hot, source, [chunk(i) for i in range(100, 110)])
    assert set(hot._teams) == {TEAM}  # t2, searched least recently, made room
    team = hot._teams.get(TEAM)
    assert team is not None
    assert hot._teams.used() == team.index.nbytes + hot.staging.nbytes(TEAM)
    hot.budget = int(1.5 * one_team)  # now the staged copy does not fit beside the team
    source.announce(physical)  # a fresh announcement (a resumed job)
    assert search(hot) is not None
    time.sleep(0.3)
    assert hot.status()["staged"] == {}
    hot.close()


def test_a_staged_copy_older_than_the_change_log_keeps_is_dropped(hot, source):
    staged_after_announcement(hot, source, [chunk(i) for i in range(100, 105)])
    hot.staging._staged[TEAM].loaded_at -= 10 * source.changes.retention_s
    assert search(hot) is not None
    assert hot.status()["staged"] == {}
    assert search(hot) is not None  # not staged again for the same announcement
    time.sleep(0.2)
    assert hot.status()["staged"] == {}


# --- item 7: every call of one search reads one version ----------------------------------
def test_a_search_that_read_the_old_version_is_not_answered_from_the_adopted_copy(hot, source):
    """The second call of a search (same read id) after a swap another search noticed: the
    adopted copy holds the new version, so memory declines and the search's pin names the old
    version for Milvus."""
    physical = staged_after_announcement(hot, source, [chunk(i) for i in range(100, 105)])
    assert search(hot, read_id="r1") == {f"{TEAM}-c{i}" for i in range(10)}
    source.switch(physical)
    assert search(hot, read_id="r2") == {f"{TEAM}-c{i}" for i in range(100, 105)}
    assert hot.candidates("milvus", None, FLT, 10, ("bm25",), "r1") is None
    assert hot.synced_candidates("milvus", None, FLT, 10, ("bm25",), "r1") is None
    assert hot.pins.get(TEAM, "r1") == "rag__t1__v1"
    assert hot.pins.get(TEAM, "r2") == physical


def test_a_search_pinned_before_a_reload_reads_its_version_after_it(hot, source):
    """Without staging: the swap evicts the team and a reload makes a new copy; a call of a
    search that read the old copy must not be answered from the new one."""
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert search(hot, read_id="r1") is not None
    source.swap([chunk(100)], version=2)
    assert search(hot, read_id="r2") is None
    assert hot.wait_loaded(TEAM, timeout_s=10)
    assert hot.candidates("x", None, FLT, 10, ("bm25",), "r1") is None
    assert hot.pins.resolve(TEAM, "r1") == "rag__t1__v1"
    assert hot.pins.resolve(TEAM, "r3") == "rag__t1__v2"


def test_a_staged_copy_whose_collection_vanished_is_dropped_at_its_next_replay(hot, source):
    physical = staged_after_announcement(hot, source, [chunk(i) for i in range(100, 105)])
    del source.collections[physical]  # dropped behind the announcement's back
    source.write([chunk(61)])  # a new head: the staged copy replays, and fails
    assert f"{TEAM}-c61" in search(hot)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and hot.status()["staged"]:
        time.sleep(0.02)
    assert hot.status()["staged"] == {}
    assert len(search(hot)) == 11


def test_a_copy_follows_a_swap_to_another_models_version_when_searches_pin_first(hot, source):
    """During a change of model the Retriever pins a search's version before asking memory
    (it picks the query vector by that version's model): a copy of the old version must still
    follow the swap, and the new version's copy has that version's vector size."""
    new = [replace(chunk(i), embed_model="next", vector=[1.0, float(i)]) for i in range(100, 105)]
    source.dims[f"{source.collection_for(TEAM)}__v2"] = 2
    physical = staged_after_announcement(hot, source, new)
    source.switch(physical)
    assert hot.pins.resolve(TEAM, "r1") == physical  # pinned before memory is asked
    found = hot.candidates("milvus", [1.0, 0.0], FLT, 10, ("dense", "bm25"), "r1")
    assert found is not None and hot.stats["adoptions"] == 1
    assert {h.chunk.embed_model for h in found["dense"]} == {"next"}
