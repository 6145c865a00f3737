"""``VersionPins``: one search reads one physical version of its team's collection.

A search may make several calls (dense, BM25 and learned sparse; BM25 while the query is
embedded, then dense; the graph's second pass; the claims of one ``enrich_answer``), each
answered from memory or by Milvus. Sent to the alias, two of them can straddle a reindex swap
and fuse lists of two versions: documents neither version gives. So the first call of a
search (its ``read_id``) *pins* the physical collection it read, and every later call of it
reads that one (from memory when the in-memory copy is of it, else Milvus by physical name).

The live physical of an alias is cached and checked against the alias's swap token (one
primary-key read of the change log, ``ChangeLog.heads``): ``switch`` points the alias first
and records the token after, so a cached name is at worst the version just replaced, still
whole (a reindex drops it only after its catch-up).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

from deployments.vector_store.memindex.changes import ChangeLog

# Searches remembered (a search's calls come within a second of each other).
PINS_KEPT = 4096


class PinSource(Protocol):
    changes: ChangeLog

    def collection_for(self, team_id: str) -> str: ...

    def live_physical(self, team_id: str) -> str | None: ...


class VersionPins:
    """Which physical version each search (``read_id``) of a team reads.

    Args:
        source: the store's versions (alias names, the change log's heads).
        kept: how many searches are remembered (oldest forgotten first).
    """

    def __init__(self, source: PinSource, *, kept: int = PINS_KEPT) -> None:
        self.source = source
        self.kept = kept
        self._pins: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._live: dict[str, tuple[str, str]] = {}  # alias → (swap token, physical)
        self._lock = threading.Lock()

    def get(self, team_id: str, read_id: str) -> str | None:
        """The physical ``read_id`` read first; ``None`` when it has not read yet."""
        if not read_id:
            return None
        return self._pins.get((team_id, read_id))

    def pin(self, team_id: str, read_id: str, physical: str) -> str:
        """Pin ``read_id`` to ``physical`` unless it is pinned already; the pinned one."""
        if not read_id:
            return physical
        key = (team_id, read_id)
        with self._lock:
            pinned = self._pins.setdefault(key, physical)
            if len(self._pins) > self.kept:
                self._pins.popitem(last=False)
        return pinned

    def learn(self, alias: str, swap_token: str, physical: str) -> None:
        """What a caller that read the heads and the alias found (saves a read)."""
        self._live[alias] = (swap_token, physical)

    def resolve(self, team_id: str, read_id: str) -> str | None:
        """The physical this search reads: its pin, else the alias's live physical (pinned);
        ``None`` when the team has no collection."""
        pinned = self.get(team_id, read_id)
        if pinned is not None:
            return pinned
        alias = self.source.collection_for(team_id)
        swap = self.source.changes.heads(alias).swap
        cached = self._live.get(alias)
        if cached is not None and cached[0] == swap:
            physical: str | None = cached[1]
        else:
            # Read after the token: a swap in between leaves a stale token, read again next time.
            physical = self.source.live_physical(team_id)
            if physical is None:  # no collection yet; one created later has no swap token
                return None
            self.learn(alias, swap, physical)
        assert physical is not None
        return self.pin(team_id, read_id, physical)
