"""``HotIndex``: the teams a Retriever replica searches, held in memory and kept coherent.

A search of a team that is loaded and in sync is answered from its ``TeamIndex`` (exact dense
top-k and BM25, well under a millisecond on tens of thousands of chunks) after one
primary-key read of the team's change-log heads (``ChangeLog.heads``); anything else — a team
not loaded yet, too large for the budget, reloaded after a reindex swap, or an error while
syncing — returns ``None`` and the caller searches Milvus as before, while a background
thread loads the team. So the answer never depends on the cache being warm, only its speed.

A reindex that announces its new version before the swap (staging.py) finds it loaded: at the
swap the staged copy is replayed and answers at once. Every call of one search reads one
physical version (pins.py): a call whose search read another version than the copy in memory
holds returns ``None`` and the caller asks Milvus for that version by name.

Budget: ``max_mb`` for all teams together, staged copies included, estimated per team
(``TeamIndex.nbytes``); a load evicts the least recently searched teams first; a team that
alone exceeds the budget is not cached (and re-checked after ``too_large_retry_s``).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from deployments.protocols import SearchHit
from deployments.timing import MeanTimes
from deployments.vector_store.filter import CompiledFilter
from deployments.vector_store.memindex.changes import Heads
from deployments.vector_store.memindex.copies import (
    RowSource,
    TeamCopy,
    TooManyChanges,
    estimate_bytes,
    read_copy,
    replay,
)
from deployments.vector_store.memindex.pins import VersionPins
from deployments.vector_store.memindex.scan import DenseScan
from deployments.vector_store.memindex.staging import Staging
from deployments.vector_store.memindex.table import LiveTeam, TeamTable

logger = logging.getLogger(__name__)

__all__ = ["HotIndex", "RowSource"]

# Read ids remembered per team (a search's second call comes within milliseconds).
READS_KEPT = 256


class HotIndex:
    """In-memory indexes of hot teams over a ``RowSource``.

    Args:
        source: the store (reads, change log).
        metric: dense metric of the collections.
        max_mb: memory budget of all teams together.
        lookback_s: how far before the newest applied change the log is re-read.
        generation_trust_s: how long after a check a search's unchanged index generation
            stands for the change-log read (``fresh``; 0: never).
        k1, b: BM25 parameters (the collections' own).
        too_large_retry_s: how long a team over the budget is not tried again.
        scan_threads, scan_busy, int8_first_pass: threads one dense scan may use, when it
            may use only one, and whether full blocks keep an int8 first pass
            (``DenseScan``).
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
        generation_trust_s: float = 0.0,
        scan_threads: int = 1,
        scan_busy: Callable[[], bool] | None = None,
        int8_first_pass: bool = False,
    ) -> None:
        self.source = source
        self.scan = DenseScan(scan_threads, scan_busy, int8_first_pass)
        self.generation_trust_s = generation_trust_s
        self.metric = metric
        self.lookback_ms = int(lookback_s * 1000)
        self.k1, self.b = k1, b
        self.too_large_retry_s = too_large_retry_s
        self._pending: set[str] = set()
        self._not_before: dict[str, float] = {}  # team → monotonic time of its next load try
        self._lock = threading.Lock()
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memindex-load")
        self.pins = VersionPins(source)
        self.staging = Staging(
            source,
            read=self._read,
            loader=self._loader,
            make_room=self._make_room,
            lookback_ms=self.lookback_ms,
        )
        self._teams = TeamTable(
            int(max_mb * 1024 * 1024),
            other_bytes=self.staging.nbytes,
            on_evict=lambda team_id: self.staging.drop(team_id, "team evicted"),
        )
        self.stats = dict.fromkeys(
            (
                "hits",
                "misses",
                "loads",
                "replays",
                "adoptions",
                "shared_checks",
                "generation_checks",
            ),
            0,
        )
        # Per search answered from memory: the change-log check, then the search itself.
        self.timing = MeanTimes()

    @property
    def budget(self) -> int:
        """Bytes all copies may hold together."""
        return self._teams.budget

    @budget.setter
    def budget(self, value: int) -> None:
        self._teams.budget = value

    # --- search ------------------------------------------------------------------------
    def candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: CompiledFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str = "",
        generation: int | None = None,
    ) -> dict[str, list[SearchHit]] | None:
        """Each method's top ``limit`` from memory, or ``None``: search Milvus instead (the
        version ``pins.resolve`` names).

        ``generation``: the team's index generation (batch_ingest/generations.py) from a read
        that began after this search arrived. When ``fresh`` says nothing was written since
        the last check of the change log, that check stands for this search's.

        A call whose ``read_id`` an earlier call of the same search synced with skips the
        change-log check: that check ran after the search began, so every write acknowledged
        before it is in memory already. A call whose search read another version than the
        one in memory returns ``None`` (after the copy was brought up to date: a search whose
        version was pinned before its first call here, as during a change of model, must not
        keep a copy from following a swap)."""
        team = self._teams.get(flt.team_id)
        started = time.perf_counter()
        pinned = self.pins.get(flt.team_id, read_id)
        synced = None
        if team is not None:
            if read_id in team.reads or self.fresh(team, generation):
                synced = team
                self.stats["generation_checks"] += read_id not in team.reads
                _remember(team, read_id)
            else:
                synced = self._sync(team, read_id, generation=generation)
        if synced is None or pinned not in (None, synced.physical):
            self.stats["misses"] += 1
            self._schedule(flt.team_id)
            return None
        self.pins.pin(flt.team_id, read_id, synced.physical)
        self.timing.add("sync", started)
        return self._search(synced, query_text, query_vector, flt, limit, methods)

    def synced_candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: CompiledFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str,
        generation: int | None = None,
    ) -> dict[str, list[SearchHit]] | None:
        """``candidates`` when this search (``read_id``) was checked already, or its
        ``generation`` is ``fresh``, without any I/O (the caller may run it on its event
        loop); ``None`` otherwise."""
        team = self._teams.get(flt.team_id)
        if team is None:
            return None
        checked = bool(read_id) and read_id in team.reads
        if not checked and not self.fresh(team, generation):
            return None
        if self.pins.get(flt.team_id, read_id) not in (None, team.physical):
            return None
        if not checked:
            self.stats["generation_checks"] += 1
            _remember(team, read_id)
            self.pins.pin(flt.team_id, read_id, team.physical)
        return self._search(team, query_text, query_vector, flt, limit, methods)

    def fresh(self, team: LiveTeam, generation: int | None) -> bool:
        """Whether ``generation`` shows that no write of ``team`` was acknowledged since its
        last check of the change log began: it is the generation read before that check,
        and every writer raises it after recording its change rows and before it answers
        (so a write acknowledged since would have raised it). Trusted only for
        ``generation_trust_s`` after the check: a raise that failed (that write's response
        says so) and a reindex's announcement (which raises nothing) wait no longer."""
        return (
            generation is not None
            and generation == team.checked_generation
            and time.monotonic() - team.check_began <= self.generation_trust_s
        )

    def _search(
        self,
        team: LiveTeam,
        query_text: str,
        query_vector: list[float] | None,
        flt: CompiledFilter,
        limit: int,
        methods: tuple[str, ...],
    ) -> dict[str, list[SearchHit]]:
        started = time.perf_counter()
        team.last_used = time.monotonic()
        found = team.index.search_methods(
            methods, flt, limit, query_text=query_text, query_vector=query_vector
        )
        self.stats["hits"] += 1
        self.timing.add("search", started)
        return found

    def _sync(
        self,
        team: LiveTeam,
        read_id: str = "",
        arrived: float | None = None,
        *,
        generation: int | None = None,
    ) -> LiveTeam | None:
        """Bring ``team`` up to every write acknowledged before this call: the copy to
        search (``team``, or the staged copy adopted at a swap), or ``None`` when it has to
        be loaded again (a swap without a staged copy, log pruned past it, or an error).

        Concurrent searches share one read of the change log: a check that *began* after
        this call arrived (it ran while this call waited for the team's lock) saw every
        write acknowledged before this call, so this call reads nothing itself."""
        if arrived is None:
            arrived = time.monotonic()
        with team.lock:
            if self._teams.get(team.team_id) is team:
                if read_id and read_id in team.reads:  # checked meanwhile by this read's call
                    return team
                if team.check_began >= arrived:
                    self.stats["shared_checks"] += 1
                    _remember(team, read_id)
                    return team
                return self._sync_locked(team, read_id, generation)
        # Replaced (a staged copy adopted, a reload) or evicted while this call waited.
        current = self._teams.get(team.team_id)
        if current is None:
            return None
        return self._sync(current, read_id, arrived, generation=generation)

    def _sync_locked(
        self, team: LiveTeam, read_id: str, generation: int | None = None
    ) -> LiveTeam | None:
        try:
            if time.monotonic() - team.checked_at > self._max_idle_s():
                raise _Reload("idle longer than the change log keeps")
            began = time.monotonic()
            heads = self.source.changes.heads(team.alias)
            if heads.swap != team.heads.swap:
                team = self._follow_swap(team, heads)
            if heads.rows != team.heads.rows:
                self.stats["replays"] += bool(
                    replay(team, self.source, team.names, self.lookback_ms)
                )
                self.staging.refresh(team.team_id, team.alias)
            if heads.next_token != team.heads.next_token:
                self.staging.notice(team.team_id, team.physical, heads)
            self.staging.expire(team.team_id, self._max_idle_s())
            team.heads = heads
            team.checked_at = time.monotonic()
            team.check_began = began
            if generation is not None:  # read before this check began
                team.checked_generation = generation
            _remember(team, read_id)
            return team
        except (_Reload, TooManyChanges) as why:
            logger.info("memory index: reloading team %s (%s)", team.team_id, why)
        except Exception as exc:  # Milvus will answer (or say it cannot)
            logger.warning("memory index: sync of team %s failed: %s", team.team_id, exc)
            self.source.changes.reset()
        self._evict(team.team_id, only=team)
        return None

    def _follow_swap(self, team: LiveTeam, heads: Heads) -> LiveTeam:
        """After a swap: ``team`` when the alias still names its collection, else the staged
        copy of the collection it names, replayed and put in its place.

        Raises:
            _Reload: no staged copy of that collection.
        """
        live = self.source.live_physical(team.team_id)
        if live is not None:
            self.pins.learn(team.alias, heads.swap, live)
        if live == team.physical:
            return team
        staged = self.staging.take(team.team_id, live or "", self._max_idle_s())
        if staged is None:
            raise _Reload("reindexed: the alias names another collection")
        with staged.lock:
            replay(staged, self.source, (team.alias, staged.physical), self.lookback_ms)
        adopted = LiveTeam.of(staged, team.alias, heads)
        adopted.last_used = team.last_used
        self._teams.replace(team, adopted)
        self.stats["adoptions"] += 1
        logger.info("memory index: team %s switched to its staged %s", team.team_id, live)
        return adopted

    def _max_idle_s(self) -> float:
        return max(self.source.changes.retention_s - 2 * self.lookback_ms / 1000, 0.0)

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

    def _read(self, team_id: str, physical: str) -> TeamCopy:
        return read_copy(
            self.source,
            team_id,
            physical,
            metric=self.metric,
            k1=self.k1,
            b=self.b,
            scan=self.scan,
        )

    def _load(self, team_id: str) -> None:
        source = self.source
        alias = source.collection_for(team_id)
        heads = source.changes.heads(alias)
        physical = source.live_physical(team_id)
        if physical is None:  # nothing stored yet: Milvus answers "no match" cheaply
            self._not_before[team_id] = time.monotonic() + 5.0
            return
        rows = source.count_team(physical, team_id)
        if estimate_bytes(rows, source.dim) > self.budget:
            self._too_large(team_id, rows)
            return
        self._make_room(estimate_bytes(rows, source.dim), team_id)
        t0 = time.perf_counter()
        team = LiveTeam.of(self._read(team_id, physical), alias, heads)
        # Writes made while the rows were read are in the log: apply them.
        replay(team, source, team.names, self.lookback_ms)
        if source.changes.heads(alias).swap != heads.swap:
            logger.info("memory index: team %s was swapped while loading; later", team_id)
            return
        if team.index.nbytes > self.budget:
            self._too_large(team_id, len(team.index))
            return
        self._teams.put(team)
        self.pins.learn(alias, heads.swap, physical)
        self._make_room(0, team_id)
        # The copy's records live until it is replaced: out of the cyclic collector's sight,
        # a full collection no longer walks tens of thousands of them during a search (they
        # hold no cycles; reference counting still frees them).
        gc.freeze()
        self.stats["loads"] += 1
        if heads.next:  # a reindex announced its version before this load: stage it too
            self.staging.notice(team_id, physical, heads)
        logger.info(
            "memory index: team %s loaded from %s: %d chunks, %.1f MB, %.2fs",
            team_id,
            physical,
            len(team.index),
            team.index.nbytes / 2**20,
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

    def _make_room(self, extra: int, keep: str) -> bool:
        return self._teams.make_room(extra, keep)

    def _evict(self, team_id: str, *, only: LiveTeam | None = None) -> None:
        self._teams.evict(team_id, only=only)

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
        teams = self._teams.teams()
        with self._lock:
            loading = sorted(self._pending)
        return {
            "enabled": True,
            "teams": len(teams),
            "chunks": sum(len(t.index) for t in teams),
            "mb": round(self._teams.used() / 2**20, 1),
            "budget_mb": round(self.budget / 2**20, 1),
            # False when configured off, or switched off by a product outside its bound.
            "int8_first_pass": self.scan.int8,
            "loading": loading,
            **self.staging.status(),
            **self.stats,
            "evictions": self._teams.evictions,
            **self.staging.stats,
            "timing": self.timing.snapshot(),
        }

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)
        self.scan.close()


class _Reload(Exception):
    """The team's in-memory copy cannot be brought up to date; load it again."""


def _remember(team: LiveTeam, read_id: str) -> None:
    """Note that search ``read_id`` was checked (its other calls need no check)."""
    if read_id:
        team.reads[read_id] = None
        if len(team.reads) > READS_KEPT:
            team.reads.popitem(last=False)
