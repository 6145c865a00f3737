"""The live in-memory copies of a replica's teams (``LiveTeam``) and the memory budget they
share with the staged copies (``TeamTable``): the least recently searched team is evicted first,
never the one being made room for."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from deployments.vector_store.memindex.changes import Heads
from deployments.vector_store.memindex.copies import TeamCopy

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class LiveTeam(TeamCopy):
    """The copy searches are answered from, and what the last check of the log found."""

    alias: str
    heads: Heads
    # Searches (read ids) already checked against the change log, newest last.
    reads: OrderedDict[str, None] = field(default_factory=OrderedDict)
    checked_at: float = field(default_factory=time.monotonic)
    # When the last successful check of the change log began (-inf: none yet); a search
    # that arrived before it is covered by it.
    check_began: float = float("-inf")
    # The team's index generation read before a successful check began (None: not known).
    checked_generation: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def names(self) -> tuple[str, ...]:
        """The change rows that concern this copy: the alias's, and those a reindex recorded
        under the physical's own name while it was announced."""
        return (self.alias, self.physical)

    @classmethod
    def of(cls, copy: TeamCopy, alias: str, heads: Heads) -> LiveTeam:
        fields = {k: getattr(copy, k) for k in TeamCopy.__dataclass_fields__}
        return cls(**fields, alias=alias, heads=heads)


class TeamTable:
    """Team id → ``LiveTeam`` within ``budget`` bytes together with ``other_bytes()`` (the
    staged copies); ``on_evict(team_id)`` drops what else the team holds."""

    def __init__(
        self, budget: int, *, other_bytes: Callable[[], int], on_evict: Callable[[str], None]
    ) -> None:
        self.budget = budget
        self._other_bytes = other_bytes
        self._on_evict = on_evict
        self._teams: dict[str, LiveTeam] = {}
        self.lock = threading.Lock()
        self.evictions = 0

    def get(self, team_id: str) -> LiveTeam | None:
        return self._teams.get(team_id)

    def __contains__(self, team_id: str) -> bool:
        return team_id in self._teams

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._teams))

    def teams(self) -> list[LiveTeam]:
        with self.lock:
            return list(self._teams.values())

    def put(self, team: LiveTeam) -> None:
        with self.lock:
            self._teams[team.team_id] = team

    def replace(self, old: LiveTeam, new: LiveTeam) -> bool:
        """Put ``new`` in ``old``'s place if ``old`` is still there."""
        with self.lock:
            if self._teams.get(old.team_id) is not old:
                return False
            self._teams[old.team_id] = new
            return True

    def evict(self, team_id: str, *, only: LiveTeam | None = None) -> None:
        """Drop the team (only when its copy is still ``only``) and what else it holds."""
        with self.lock:
            team = self._teams.get(team_id)
            if team is None or (only is not None and team is not only):
                return
            del self._teams[team_id]
            self.evictions += 1
        self._on_evict(team_id)

    def used(self) -> int:
        """Bytes held by the live copies and the staged ones."""
        return sum(t.index.nbytes for t in self.teams()) + self._other_bytes()

    def make_room(self, extra: int, keep: str) -> bool:
        """Evict the least recently searched teams (never ``keep``) until ``extra`` more
        bytes fit the budget; whether they fit."""
        while True:
            used = self.used()
            with self.lock:
                others = [t for t in self._teams.values() if t.team_id != keep]
                if used + extra <= self.budget or not others:
                    return used + extra <= self.budget
                victim = min(others, key=lambda t: t.last_used)
            logger.info("memory index: evicting team %s (budget)", victim.team_id)
            self.evict(victim.team_id, only=victim)
