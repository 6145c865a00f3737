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

Beside it: sync.py brings a copy up to date with the change log, loader.py loads teams on the
background thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from deployments.protocols import SearchHit
from deployments.timing import MeanTimes
from deployments.vector_store.filter import CompiledFilter
from deployments.vector_store.memindex.copies import RowSource, read_copy
from deployments.vector_store.memindex.loader import TeamLoader
from deployments.vector_store.memindex.pins import VersionPins
from deployments.vector_store.memindex.scan import DenseScan
from deployments.vector_store.memindex.staging import Staging
from deployments.vector_store.memindex.sync import TeamSync, remember
from deployments.vector_store.memindex.table import LiveTeam, TeamTable

__all__ = ["HotIndex", "RowSource"]


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
        self.lookback_ms = int(lookback_s * 1000)
        self.pins = VersionPins(source)
        # One thread loads teams and stages announced versions; both read copies alike.
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memindex-load")
        read = partial(read_copy, source, metric=metric, k1=k1, b=b, scan=self.scan)
        self.staging = Staging(
            source,
            read=read,
            loader=thread,
            # The table, made next, counts the staged copies against the budget.
            make_room=lambda extra, keep: self._teams.make_room(extra, keep),
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
        self.sync = TeamSync(
            source,
            self._teams,
            self.staging,
            self.pins,
            lookback_ms=self.lookback_ms,
            stats=self.stats,
        )
        self.loader = TeamLoader(
            source,
            self._teams,
            self.staging,
            self.pins,
            thread=thread,
            read=read,
            lookback_ms=self.lookback_ms,
            too_large_retry_s=too_large_retry_s,
            stats=self.stats,
        )

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
                remember(team, read_id)
            else:
                synced = self.sync.catch_up(team, read_id, generation=generation)
        if synced is None or pinned not in (None, synced.physical):
            self.stats["misses"] += 1
            self.loader.schedule(flt.team_id)
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
            remember(team, read_id)
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

    # --- operators ---------------------------------------------------------------------
    def wait_loaded(self, team_id: str, timeout_s: float = 60.0) -> bool:
        """Schedule ``team_id`` and wait until it is searchable from memory (tests, bench)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if team_id in self._teams:
                return True
            self.loader.schedule(team_id)
            time.sleep(0.05)
        return False

    def status(self) -> dict[str, Any]:
        teams = self._teams.teams()
        loading = self.loader.loading()
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
        self.loader.close()
        self.scan.close()
