"""``Staging``: the in-memory copy of the version a reindex will swap to, ready before the swap.

A reindex job announces its new physical version (``CollectionVersions.announce``: the
alias's ``next:`` row in the change log) once it holds the bulk of its rows. A replica holding
the team notices it in the heads it reads per search and loads that version in the background
beside the live copy (the staged copy counts toward the memory budget; one that does not fit
is not staged). The job's later writes into it are change rows named after the physical
collection; each bumps the alias's head, and a replica then replays them onto the staged copy
in the background too. At the swap, ``HotIndex`` takes the staged copy of the physical the
alias now names, replays what is left (rows under that physical's name and under the alias)
and answers from it at once: no eviction, no search in Milvus.

An abandoned announcement breaks nothing: a withdrawn or replaced one (``withdraw``, or the
version dropped through ``CollectionVersions.drop``) drops the staged copy; so does a replay
that fails (the collection dropped some other way); one older than the change log keeps rows
is dropped too (it could not be replayed) and not loaded again for that announcement; a
version that cannot be read is simply not staged. Whatever was dropped, the swap behaves as
without staging: the team is loaded again while Milvus answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from deployments.vector_store.memindex.changes import Heads
from deployments.vector_store.memindex.copies import (
    RowSource,
    TeamCopy,
    TooManyChanges,
    estimate_bytes,
    replay,
)

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Staged(TeamCopy):
    """A staged copy and the announcement (its token) it was loaded for."""

    token: str
    lock: threading.Lock = field(default_factory=threading.Lock)


class Staging:
    """Staged copies of announced versions, one per team at most.

    Args:
        source: the store's versions.
        read: reads a team's rows of a physical collection (``copies.read_copy``).
        loader: runs the loads and replays (the ``HotIndex`` loader thread).
        make_room: ``(extra_bytes, keep_team) → fits``: evicts other teams until it fits.
        lookback_ms: as ``HotIndex``'s.
    """

    def __init__(
        self,
        source: RowSource,
        *,
        read: Callable[[str, str], TeamCopy],
        loader: Executor,
        make_room: Callable[[int, str], bool],
        lookback_ms: int,
    ) -> None:
        self.source = source
        self._read = read
        self._loader = loader
        self._make_room = make_room
        self.lookback_ms = lookback_ms
        self._staged: dict[str, Staged] = {}
        self._wanted: dict[str, tuple[str, str]] = {}  # team → (physical, token) to stage
        self._expired: dict[str, str] = {}  # team → token whose copy grew too old
        self._busy: set[str] = set()  # teams with a replay queued
        self._lock = threading.Lock()
        self.stats = dict.fromkeys(("stages", "stage_drops"), 0)

    def notice(self, team_id: str, live_physical: str, heads: Heads) -> None:
        """The team's heads show another announcement: stage it, or drop what is staged."""
        physical, token = heads.next, heads.next_token
        if not physical or physical == live_physical:
            self.drop(team_id, "announcement cleared")
            return
        with self._lock:
            if (
                self._wanted.get(team_id) == (physical, token)
                or self._expired.get(team_id) == token
            ):
                return
        self.drop(team_id, "another announcement")
        with self._lock:
            self._wanted[team_id] = (physical, token)
        self._loader.submit(self._load_safely, team_id, physical, token)

    def refresh(self, team_id: str, alias: str) -> None:
        """Replay new change rows onto the team's staged copy in the background (so that
        little is left to replay at the swap)."""
        with self._lock:
            if team_id not in self._staged or team_id in self._busy:
                return
            self._busy.add(team_id)
        self._loader.submit(self._refresh_safely, team_id, alias)

    def take(self, team_id: str, physical: str, max_age_s: float) -> Staged | None:
        """Remove and return the team's staged copy when it is of ``physical`` and young
        enough to replay; drop it otherwise."""
        with self._lock:
            staged = self._staged.pop(team_id, None)
            self._wanted.pop(team_id, None)
        if staged is None:
            return None
        if staged.physical != physical or time.monotonic() - staged.loaded_at > max_age_s:
            self.stats["stage_drops"] += 1
            logger.info("memory index: staged copy of %s not adopted", staged.physical)
            return None
        return staged

    def expire(self, team_id: str, max_age_s: float) -> None:
        """Drop a staged copy older than the change log keeps rows (it cannot be replayed),
        and do not stage that announcement again."""
        staged = self._staged.get(team_id)
        if staged is not None and time.monotonic() - staged.loaded_at > max_age_s:
            with self._lock:
                self._expired[team_id] = staged.token
            self.drop(team_id, "older than the change log keeps")

    def drop(self, team_id: str, why: str) -> None:
        with self._lock:
            self._wanted.pop(team_id, None)
            staged = self._staged.pop(team_id, None)
        if staged is not None:
            self.stats["stage_drops"] += 1
            logger.info("memory index: dropped staged copy of %s (%s)", staged.physical, why)

    def nbytes(self, team_id: str | None = None) -> int:
        """Memory of the staged copies (of one team)."""
        with self._lock:
            copies = [s for t, s in self._staged.items() if team_id in (None, t)]
        return sum(s.index.nbytes for s in copies)

    def wait(self, team_id: str, physical: str, timeout_s: float = 60.0) -> bool:
        """Wait until a staged copy of ``physical`` is held for ``team_id`` (tests, bench;
        a search of the team notices the announcement)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                staged = self._staged.get(team_id)
            if staged is not None and staged.physical == physical:
                return True
            time.sleep(0.05)
        return False

    def status(self) -> dict[str, Any]:
        with self._lock:
            staged = {t: s.physical for t, s in self._staged.items()}
            wanted = sorted(t for t in self._wanted if t not in self._staged)
        return {"staged": staged, "staging": wanted}

    # --- in the loader thread ------------------------------------------------------------
    def _load_safely(self, team_id: str, physical: str, token: str) -> None:
        try:
            self._load(team_id, physical, token)
        except Exception as exc:  # the version may be gone (a failed job dropped it)
            logger.warning("memory index: staging %s failed: %s", physical, exc)
            with self._lock:
                if self._wanted.get(team_id) == (physical, token):
                    self._wanted.pop(team_id)

    def _load(self, team_id: str, physical: str, token: str) -> None:
        if not self._still_wanted(team_id, physical, token):
            return
        rows = self.source.count_team(physical, team_id)
        if not self._make_room(estimate_bytes(rows, self.source.dim), team_id):
            logger.warning(
                "memory index: %s (%d chunks) does not fit beside team %s; not staged",
                physical,
                rows,
                team_id,
            )
            return
        started = time.perf_counter()
        copy = self._read(team_id, physical)
        staged = Staged(**vars(copy), token=token)
        # What was written while reading, and the alias's rows of the lookback (a swap
        # would replay them onto this copy otherwise, in a search).
        alias = self.source.collection_for(team_id)
        replay(staged, self.source, (alias, physical), self.lookback_ms)
        with self._lock:
            if self._wanted.get(team_id) != (physical, token):
                return  # withdrawn (or replaced, or the team evicted) meanwhile
            self._staged[team_id] = staged
        if not self._make_room(0, team_id):
            self.drop(team_id, "over the memory budget")
            return
        self.stats["stages"] += 1
        logger.info(
            "memory index: staged %s for team %s: %d chunks, %.1f MB, %.2fs",
            physical,
            team_id,
            len(staged.index),
            staged.index.nbytes / 2**20,
            time.perf_counter() - started,
        )

    def _still_wanted(self, team_id: str, physical: str, token: str) -> bool:
        with self._lock:
            return self._wanted.get(team_id) == (physical, token)

    def _refresh_safely(self, team_id: str, alias: str) -> None:
        try:
            staged = self._staged.get(team_id)
            if staged is None:
                return
            with staged.lock:
                replay(staged, self.source, (alias, staged.physical), self.lookback_ms)
        except TooManyChanges:
            self.drop(team_id, "too many changes to replay")
        except Exception as exc:  # its collection dropped, most likely: the swap reloads
            self.drop(team_id, f"replay failed: {exc}")
        finally:
            with self._lock:
                self._busy.discard(team_id)
