"""``TeamSync``: brings a team's in-memory copy up to every write acknowledged before a search.

One primary-key read of the alias's change-log heads (``ChangeLog.heads``) says what changed
since the copy's last check: new change rows are replayed onto it (copies.py), a reindex swap
is followed to the staged copy of the version the alias names now (staging.py), and a new
announcement is noticed so that version gets staged. Concurrent searches of one team share
one such read, under the team's lock: a check that began after a search arrived saw every
write acknowledged before it. A copy that cannot be brought up to date (a swap with nothing
staged, a change log pruned past it, an error) is evicted; the caller then searches Milvus
while the team is loaded again (loader.py). ``HotIndex`` (hot.py) answers searches from what
this keeps up to date.
"""

from __future__ import annotations

import logging
import time

from deployments.vector_store.memindex.changes import Heads
from deployments.vector_store.memindex.copies import RowSource, TooManyChanges, replay
from deployments.vector_store.memindex.pins import VersionPins
from deployments.vector_store.memindex.staging import Staging
from deployments.vector_store.memindex.table import LiveTeam, TeamTable

logger = logging.getLogger(__name__)

# Read ids remembered per team (a search's second call comes within milliseconds).
READS_KEPT = 256


class TeamSync:
    """Checks live copies against the change log, and replays or replaces them.

    Args:
        source: the store (reads, change log).
        teams: the live copies; one that cannot be brought up to date is evicted.
        staging: the staged copies: refreshed, noticed, expired and adopted at a swap.
        pins: learns the physical collection each swap left the alias naming.
        lookback_ms: as ``HotIndex``'s.
        stats: the index's counters (``shared_checks``, ``replays``, ``adoptions``).
    """

    def __init__(
        self,
        source: RowSource,
        teams: TeamTable,
        staging: Staging,
        pins: VersionPins,
        *,
        lookback_ms: int,
        stats: dict[str, int],
    ) -> None:
        self.source = source
        self.teams = teams
        self.staging = staging
        self.pins = pins
        self.lookback_ms = lookback_ms
        self.stats = stats

    def catch_up(
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
            if self.teams.get(team.team_id) is team:
                if read_id and read_id in team.reads:  # checked meanwhile by this read's call
                    return team
                if team.check_began >= arrived:
                    self.stats["shared_checks"] += 1
                    remember(team, read_id)
                    return team
                return self._catch_up_locked(team, read_id, generation)
        # Replaced (a staged copy adopted, a reload) or evicted while this call waited.
        current = self.teams.get(team.team_id)
        if current is None:
            return None
        return self.catch_up(current, read_id, arrived, generation=generation)

    def _catch_up_locked(
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
            remember(team, read_id)
            return team
        except (_Reload, TooManyChanges) as why:
            logger.info("memory index: reloading team %s (%s)", team.team_id, why)
        except Exception as exc:  # Milvus will answer (or say it cannot)
            logger.warning("memory index: sync of team %s failed: %s", team.team_id, exc)
            self.source.changes.reset()
        self.teams.evict(team.team_id, only=team)
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
        self.teams.replace(team, adopted)
        self.stats["adoptions"] += 1
        logger.info("memory index: team %s switched to its staged %s", team.team_id, live)
        return adopted

    def _max_idle_s(self) -> float:
        return max(self.source.changes.retention_s - 2 * self.lookback_ms / 1000, 0.0)


class _Reload(Exception):
    """The team's in-memory copy cannot be brought up to date; load it again."""


def remember(team: LiveTeam, read_id: str) -> None:
    """Note that search ``read_id`` was checked (its other calls need no check)."""
    if read_id:
        team.reads[read_id] = None
        if len(team.reads) > READS_KEPT:
            team.reads.popitem(last=False)
