"""``TeamLoader``: brings a team into the in-memory index in the background, within its budget.

A search of a team that is not in memory is answered by Milvus while this loads the team on
the loader thread (which stages announced versions too, staging.py): the rows of the team's
live version are read, the writes made meanwhile are replayed from the change log, and the
copy joins the table (table.py) once the least recently searched teams made room for it.
Searches never wait for a load. A team that alone exceeds the budget is not loaded, and not
tried again for ``too_large_retry_s``; a team with nothing stored, or whose load failed, is
tried again after ``RETRY_S``; a team swapped while it loaded is loaded at its next search.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from deployments.vector_store.memindex.copies import RowSource, TeamCopy, estimate_bytes, replay
from deployments.vector_store.memindex.pins import VersionPins
from deployments.vector_store.memindex.staging import Staging
from deployments.vector_store.memindex.table import LiveTeam, TeamTable

logger = logging.getLogger(__name__)

# Seconds before a team with nothing stored, or whose load failed, is tried again.
RETRY_S = 5.0


class TeamLoader:
    """Loads teams into ``teams``, one at a time on ``thread``.

    Args:
        source: the store (reads, change log).
        teams: the live copies and the budget they share with the staged ones.
        staging: the staged copies; a load that finds an announced version stages it too.
        pins: learns the physical collection each swap left the alias naming.
        thread: the loader thread (``staging`` runs its loads and replays there too).
        read: reads a team's rows of a physical collection (``copies.read_copy``).
        lookback_ms: as ``HotIndex``'s.
        too_large_retry_s: how long a team over the budget is not tried again.
        stats: the index's counters (``loads`` is counted here).
    """

    def __init__(
        self,
        source: RowSource,
        teams: TeamTable,
        staging: Staging,
        pins: VersionPins,
        *,
        thread: ThreadPoolExecutor,
        read: Callable[[str, str], TeamCopy],
        lookback_ms: int,
        too_large_retry_s: float,
        stats: dict[str, int],
    ) -> None:
        self.source = source
        self.teams = teams
        self.staging = staging
        self.pins = pins
        self._thread = thread
        self._read = read
        self.lookback_ms = lookback_ms
        self.too_large_retry_s = too_large_retry_s
        self.stats = stats
        self._pending: set[str] = set()
        self._not_before: dict[str, float] = {}  # team → monotonic time of its next load try
        self._lock = threading.Lock()

    def schedule(self, team_id: str) -> None:
        """Load ``team_id`` in the background, unless it is loaded, loading, or waiting for
        its next try."""
        with self._lock:
            if team_id in self._pending or team_id in self.teams:
                return
            if time.monotonic() < self._not_before.get(team_id, 0.0):
                return
            self._pending.add(team_id)
        self._thread.submit(self._load_safely, team_id)

    def loading(self) -> list[str]:
        """The teams being loaded or waiting for the loader thread."""
        with self._lock:
            return sorted(self._pending)

    def _load_safely(self, team_id: str) -> None:
        try:
            self._load(team_id)
        except Exception as exc:
            logger.warning("memory index: loading team %s failed: %s", team_id, exc)
            self._not_before[team_id] = time.monotonic() + RETRY_S
        finally:
            with self._lock:
                self._pending.discard(team_id)

    def _load(self, team_id: str) -> None:
        source = self.source
        alias = source.collection_for(team_id)
        heads = source.changes.heads(alias)
        physical = source.live_physical(team_id)
        if physical is None:  # nothing stored yet: Milvus answers "no match" cheaply
            self._not_before[team_id] = time.monotonic() + RETRY_S
            return
        rows = source.count_team(physical, team_id)
        if estimate_bytes(rows, source.dim) > self.teams.budget:
            self._too_large(team_id, rows)
            return
        self.teams.make_room(estimate_bytes(rows, source.dim), team_id)
        t0 = time.perf_counter()
        team = LiveTeam.of(self._read(team_id, physical), alias, heads)
        # Writes made while the rows were read are in the log: apply them.
        replay(team, source, team.names, self.lookback_ms)
        if source.changes.heads(alias).swap != heads.swap:
            logger.info("memory index: team %s was swapped while loading; later", team_id)
            return
        if team.index.nbytes > self.teams.budget:
            self._too_large(team_id, len(team.index))
            return
        self.teams.put(team)
        self.pins.learn(alias, heads.swap, physical)
        self.teams.make_room(0, team_id)
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
            self.teams.budget / 2**20,
        )

    def close(self) -> None:
        """Stop the loader thread; what it had not begun is dropped."""
        self._thread.shutdown(wait=False, cancel_futures=True)
