"""One team's rows of one physical collection held in memory (``TeamCopy``): how it is read
from Milvus and how the change log is replayed onto it. ``HotIndex`` (hot.py) keeps the live
copy of each hot team; staging.py keeps a copy of the version a reindex announced, loaded
before its swap.

A replay is state-based: the chunk ids named by the change rows since the copy's watermark
(minus the lookback) are read again from the copy's physical collection, present → upsert,
absent → remove. So replaying a change twice, late, or one recorded against another version
(the rows a live write recorded under the alias before a swap, replayed onto the new
version) leaves the copy equal to its collection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from deployments.protocols import ChunkRecord
from deployments.vector_store.memindex.changes import ChangeLog, now_ms
from deployments.vector_store.memindex.scan import DenseScan
from deployments.vector_store.memindex.team import TeamIndex

# Bytes a chunk costs beyond its vector, for the estimate made before a team is loaded.
ROW_ESTIMATE = 3000
# More changed chunks than this (and than the team holds) reload the team instead.
REPLAY_MAX = 5000


class RowSource(Protocol):
    """What the in-memory index reads from the store (``MilvusStore.versions``)."""

    changes: ChangeLog
    dim: int

    def collection_for(self, team_id: str) -> str: ...

    def live_physical(self, team_id: str) -> str | None: ...

    def count_team(self, physical: str, team_id: str) -> int: ...

    def iter_rows(self, physical: str, team_id: str) -> Iterator[list[ChunkRecord]]: ...

    def fetch_rows(self, physical: str, chunk_ids: list[str]) -> list[ChunkRecord]: ...


@dataclass(kw_only=True)
class TeamCopy:
    """``team_id``'s chunks of ``physical`` as of ``watermark_ms`` plus the change rows in
    ``applied`` (change id → its ``at_ms``)."""

    team_id: str
    physical: str
    index: TeamIndex
    watermark_ms: int
    applied: dict[str, int] = field(default_factory=dict)
    loaded_at: float = field(default_factory=time.monotonic)


class TooManyChanges(Exception):
    """More changed chunks than a replay should fetch one by one: read the copy again."""


def estimate_bytes(rows: int, dim: int) -> int:
    """Memory a copy of ``rows`` chunks of ``dim``-d vectors takes, before it is read."""
    return rows * (4 * dim + ROW_ESTIMATE)


def read_copy(
    source: RowSource,
    team_id: str,
    physical: str,
    *,
    metric: str,
    k1: float,
    b: float,
    scan: DenseScan | None = None,
) -> TeamCopy:
    """Every row of ``team_id`` in ``physical``; its watermark is when the read began (the
    writes made while it ran are in the change log: replay them before answering)."""
    started_ms = now_ms()
    # What the store knows of its collections (``CollectionShapes``; a stand-in may have none).
    shapes = getattr(source, "shapes", None)
    # A version of a model this process does not embed with is refused, not loaded.
    check_model = getattr(shapes, "check_model", None)
    if check_model is not None:
        check_model(physical)
    # A version built for another model (a change of model) has its own vector size.
    dim_of = getattr(shapes, "dim_of", None)
    dim = dim_of(physical) if dim_of is not None else source.dim
    index = TeamIndex(dim=dim, metric=metric, k1=k1, b=b, scan=scan)
    for batch in source.iter_rows(physical, team_id):
        index.upsert(batch)
    index.prepare_scan()
    return TeamCopy(team_id=team_id, physical=physical, index=index, watermark_ms=started_ms)


def replay(copy: TeamCopy, source: RowSource, names: tuple[str, ...], lookback_ms: int) -> int:
    """Apply the change rows named ``names`` since the copy's watermark (minus the lookback)
    that it has not applied yet, in one step searches never see half of. Returns how many
    change rows were applied.

    Raises:
        TooManyChanges: more ids changed than ``REPLAY_MAX`` and than the copy holds.
    """
    changes = source.changes.since(names, copy.watermark_ms - lookback_ms)
    fresh = [c for c in changes if c.change_id not in copy.applied]
    if fresh:
        ids = list(dict.fromkeys(cid for c in fresh for cid in c.chunk_ids))
        if len(ids) > max(REPLAY_MAX, len(copy.index)):
            raise TooManyChanges(f"{len(ids)} chunks changed")
        rows = [r for r in source.fetch_rows(copy.physical, ids) if r.team_id == copy.team_id]
        present = {r.chunk_id for r in rows}
        copy.index.apply(rows, [cid for cid in ids if cid not in present])
        for change in fresh:
            copy.applied[change.change_id] = change.at_ms
        copy.watermark_ms = max(copy.watermark_ms, max(c.at_ms for c in fresh))
    floor = copy.watermark_ms - 2 * lookback_ms
    copy.applied = {cid: at for cid, at in copy.applied.items() if at >= floor}
    return len(fresh)
