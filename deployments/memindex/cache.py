"""``HotIndex``: the teams a Retriever replica searches, held in memory and kept coherent.

A search of a team that is loaded and in sync is answered from its ``TeamIndex`` (exact dense
top-k and BM25, well under a millisecond on tens of thousands of chunks) after one
primary-key read of the team's change-log heads (``ChangeLog.heads``); anything else — a team
not loaded yet, too large for the budget, being reloaded after a reindex swap, or an error
while syncing — returns ``None`` and the caller searches Milvus as before, while a background
thread loads the team. So the answer never depends on the cache being warm, only its speed.

Budget: ``max_mb`` for all teams together, estimated per team (``TeamIndex.nbytes``); a load
evicts the least recently searched teams first; a team that alone exceeds the budget is not
cached (and re-checked after ``too_large_retry_s``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.memindex.changes import ChangeLog, Heads, now_ms
from deployments.memindex.team import TeamIndex
from deployments.protocols import ChunkRecord, SearchHit
from deployments.search_filter import CompiledFilter
from deployments.timing import MeanTimes

logger = logging.getLogger(__name__)

# Bytes a chunk costs beyond its vector, for the estimate made before a team is loaded.
ROW_ESTIMATE = 3000
# More changed chunks than this (and than the team holds) reload the team instead.
REPLAY_MAX = 5000
# Read ids remembered per team (a search's second call comes within milliseconds).
READS_KEPT = 256


class RowSource(Protocol):
    """What ``HotIndex`` reads from the store (``MilvusStore.versions`` implements it)."""

    changes: ChangeLog
    dim: int

    def collection_for(self, team_id: str) -> str: ...

    def live_physical(self, team_id: str) -> str | None: ...

    def count_team(self, physical: str, team_id: str) -> int: ...

    def iter_rows(self, physical: str, team_id: str) -> Iterator[list[ChunkRecord]]: ...

    def fetch_rows(self, physical: str, chunk_ids: list[str]) -> list[ChunkRecord]: ...


@dataclass
class _Team:
    team_id: str
    alias: str
    physical: str
    index: TeamIndex
    heads: Heads
    watermark_ms: int
    applied: dict[str, int] = field(default_factory=dict)  # change id → at_ms
    # Searches (read ids) already checked against the change log, newest last.
    reads: OrderedDict[str, None] = field(default_factory=OrderedDict)
    checked_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


class HotIndex:
    """In-memory indexes of hot teams over a ``RowSource``.

    Args:
        source: the store (reads, change log).
        metric: dense metric of the collections.
        max_mb: memory budget of all teams together.
        lookback_s: how far before the newest applied change the log is re-read.
        k1, b: BM25 parameters (the collections' own).
        too_large_retry_s: how long a team over the budget is not tried again.
    """

    def __init__(
        self,
        source: RowSource,
        *,
        metric: str = "COSINE",
        max_mb: float = 1024.0,
        lookback_s: float = 30.0,
        k1: float = 1.5,
        b: float = 0.75,
        too_large_retry_s: float = 600.0,
    ) -> None:
        self.source = source
        self.metric = metric
        self.budget = int(max_mb * 1024 * 1024)
        self.lookback_ms = int(lookback_s * 1000)
        self.k1, self.b = k1, b
        self.too_large_retry_s = too_large_retry_s
        self._teams: dict[str, _Team] = {}
        self._pending: set[str] = set()
        self._not_before: dict[str, float] = {}  # team → monotonic time of its next load try
        self._lock = threading.Lock()
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memindex-load")
        self.stats = dict.fromkeys(("hits", "misses", "loads", "evictions", "replays"), 0)
        # Per search answered from memory: the change-log check, then the search itself.
        self.timing = MeanTimes()

    # --- search ------------------------------------------------------------------------
    def candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: CompiledFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str = "",
    ) -> dict[str, list[SearchHit]] | None:
        """Each method's top ``limit`` from memory, or ``None``: search Milvus instead.

        A call whose ``read_id`` an earlier call of the same search synced with skips the
        change-log check: that check ran after the search began, so every write acknowledged
        before it is in memory already."""
        team = self._teams.get(flt.team_id)
        started = time.perf_counter()
        if team is None or not (read_id in team.reads or self._sync(team, read_id)):
            self.stats["misses"] += 1
            self._schedule(flt.team_id)
            return None
        self.timing.add("sync", started)
        return self._search(team, query_text, query_vector, flt, limit, methods)

    def synced_candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: CompiledFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str,
    ) -> dict[str, list[SearchHit]] | None:
        """``candidates`` when this search (``read_id``) was checked already, without any
        I/O (the caller may run it on its event loop); ``None`` otherwise."""
        team = self._teams.get(flt.team_id)
        if team is None or not read_id or read_id not in team.reads:
            return None
        return self._search(team, query_text, query_vector, flt, limit, methods)

    def _search(
        self,
        team: _Team,
        query_text: str,
        query_vector: list[float] | None,
        flt: CompiledFilter,
        limit: int,
        methods: tuple[str, ...],
    ) -> dict[str, list[SearchHit]]:
        started = time.perf_counter()
        team.last_used = time.monotonic()
        found = {
            method: team.index.search(
                method, flt, limit, query_text=query_text, query_vector=query_vector
            )
            for method in methods
        }
        self.stats["hits"] += 1
        self.timing.add("search", started)
        return found

    def _sync(self, team: _Team, read_id: str = "") -> bool:
        """Bring ``team`` up to every write acknowledged before this call; ``False`` when it
        has to be loaded again (reindex swap, log pruned past it, or an error)."""
        with team.lock:
            if read_id and read_id in team.reads:  # checked meanwhile by a call of this read
                return True
            try:
                if time.monotonic() - team.checked_at > self._max_idle_s():
                    raise _Reload("idle longer than the change log keeps")
                heads = self.source.changes.heads(team.alias)
                swapped = heads.swap != team.heads.swap
                if swapped and self.source.live_physical(team.team_id) != team.physical:
                    raise _Reload("reindexed: the alias names another collection")
                if heads.rows != team.heads.rows:
                    self._replay(team)
                team.heads = heads
                team.checked_at = time.monotonic()
                if read_id:
                    team.reads[read_id] = None
                    if len(team.reads) > READS_KEPT:
                        team.reads.popitem(last=False)
                return True
            except _Reload as why:
                logger.info("memory index: reloading team %s (%s)", team.team_id, why)
            except Exception as exc:  # Milvus will answer (or say it cannot)
                logger.warning("memory index: sync of team %s failed: %s", team.team_id, exc)
                self.source.changes.reset()
            self._evict(team.team_id)
            return False

    def _max_idle_s(self) -> float:
        return max(self.source.changes.retention_s - 2 * self.lookback_ms / 1000, 0.0)

    def _replay(self, team: _Team) -> None:
        """Apply the change rows since the watermark (minus the lookback) not applied yet:
        re-read their chunk ids; present → upsert, absent → remove."""
        changes = self.source.changes.since(team.alias, team.watermark_ms - self.lookback_ms)
        fresh = [c for c in changes if c.change_id not in team.applied]
        if fresh:
            ids = list(dict.fromkeys(cid for c in fresh for cid in c.chunk_ids))
            if len(ids) > max(REPLAY_MAX, len(team.index)):
                # A bulk load: reading the team again is cheaper than fetching row by row.
                raise _Reload(f"{len(ids)} chunks changed")
            rows = [
                r for r in self.source.fetch_rows(team.physical, ids) if r.team_id == team.team_id
            ]
            present = {r.chunk_id for r in rows}
            team.index.upsert(rows)
            team.index.remove(cid for cid in ids if cid not in present)
            for change in fresh:
                team.applied[change.change_id] = change.at_ms
            team.watermark_ms = max(team.watermark_ms, max(c.at_ms for c in fresh))
            self.stats["replays"] += 1
        floor = team.watermark_ms - 2 * self.lookback_ms
        team.applied = {cid: at for cid, at in team.applied.items() if at >= floor}

    # --- loading and the budget --------------------------------------------------------
    def _schedule(self, team_id: str) -> None:
        with self._lock:
            if team_id in self._pending or team_id in self._teams:
                return
            if time.monotonic() < self._not_before.get(team_id, 0.0):
                return
            self._pending.add(team_id)
        self._loader.submit(self._load_safely, team_id)

    def _load_safely(self, team_id: str) -> None:
        try:
            self._load(team_id)
        except Exception as exc:
            logger.warning("memory index: loading team %s failed: %s", team_id, exc)
            self._not_before[team_id] = time.monotonic() + 5.0
        finally:
            with self._lock:
                self._pending.discard(team_id)

    def _load(self, team_id: str) -> None:
        source = self.source
        alias = source.collection_for(team_id)
        heads = source.changes.heads(alias)
        physical = source.live_physical(team_id)
        if physical is None:  # nothing stored yet: Milvus answers "no match" cheaply
            self._not_before[team_id] = time.monotonic() + 5.0
            return
        started_ms = now_ms()
        rows = source.count_team(physical, team_id)
        if rows * (4 * source.dim + ROW_ESTIMATE) > self.budget:
            self._too_large(team_id, rows)
            return
        self._make_room(rows * (4 * source.dim + ROW_ESTIMATE), keep=team_id)
        t0 = time.perf_counter()
        index = TeamIndex(dim=source.dim, metric=self.metric, k1=self.k1, b=self.b)
        for batch in source.iter_rows(physical, team_id):
            index.upsert(batch)
        team = _Team(team_id, alias, physical, index, heads, watermark_ms=started_ms)
        # Writes made while the rows were read are in the log: apply them.
        self._replay(team)
        if source.changes.heads(alias).swap != heads.swap:
            logger.info("memory index: team %s was swapped while loading; later", team_id)
            return
        if index.nbytes > self.budget:
            self._too_large(team_id, len(index))
            return
        with self._lock:
            self._teams[team_id] = team
        self._make_room(0, keep=team_id)
        self.stats["loads"] += 1
        logger.info(
            "memory index: team %s loaded from %s: %d chunks, %.1f MB, %.2fs",
            team_id,
            physical,
            len(index),
            index.nbytes / 2**20,
            time.perf_counter() - t0,
        )

    def _too_large(self, team_id: str, rows: int) -> None:
        self._not_before[team_id] = time.monotonic() + self.too_large_retry_s
        logger.warning(
            "memory index: team %s (%d chunks) does not fit the budget of %.0f MB; "
            "its searches go to Milvus",
            team_id,
            rows,
            self.budget / 2**20,
        )

    def _make_room(self, extra: int, *, keep: str) -> None:
        """Evict the least recently searched teams (never ``keep``) until ``extra`` more
        bytes fit the budget."""
        while True:
            with self._lock:
                used = sum(t.index.nbytes for t in self._teams.values())
                others = [t for t in self._teams.values() if t.team_id != keep]
                if used + extra <= self.budget or not others:
                    return
                victim = min(others, key=lambda t: t.last_used).team_id
            logger.info("memory index: evicting team %s (budget)", victim)
            self._evict(victim)

    def _evict(self, team_id: str) -> None:
        with self._lock:
            if self._teams.pop(team_id, None) is not None:
                self.stats["evictions"] += 1

    # --- operators ---------------------------------------------------------------------
    def wait_loaded(self, team_id: str, timeout_s: float = 60.0) -> bool:
        """Schedule ``team_id`` and wait until it is searchable from memory (tests, bench)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if team_id in self._teams:
                return True
            self._schedule(team_id)
            time.sleep(0.05)
        return False

    def status(self) -> dict[str, Any]:
        with self._lock:
            teams = list(self._teams.values())
            loading = sorted(self._pending)
        return {
            "enabled": True,
            "teams": len(teams),
            "chunks": sum(len(t.index) for t in teams),
            "mb": round(sum(t.index.nbytes for t in teams) / 2**20, 1),
            "budget_mb": round(self.budget / 2**20, 1),
            "loading": loading,
            **self.stats,
            "timing": self.timing.snapshot(),
        }

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)


class _Reload(Exception):
    """The team's in-memory copy cannot be brought up to date; load it again."""
