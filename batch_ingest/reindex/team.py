"""Is there a team to reindex? One with no live document in the source registry and no
collection is unknown (a typo, most likely): reindexing it would answer ``succeeded`` and
leave an empty collection and alias behind, so it is refused unless asked for on purpose
(``--allow-empty``, ``"allow_empty": true``). A team whose documents were all deleted still
has its collection: it is not unknown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from batch_ingest.reindex.options import ReindexError


class _Documents(Protocol):
    def count(self, team_id: str) -> int: ...


class UnknownTeam(ReindexError):
    """The team has no documents and no collection (answered 404 by the admin API)."""

    status_code = 404
    code = "unknown_team"


def require_known_team(
    team_id: str, sources: _Documents, current: Callable[[str], int | None]
) -> None:
    """Raise ``UnknownTeam`` unless ``team_id`` has a live document or a collection.

    Args:
        sources: the source registry (``SourceStore``).
        current: the team's live collection version or ``None``
            (``CollectionVersions.current``); called only when the registry has nothing, so
            a team with documents never needs Milvus here.
    """
    if sources.count(team_id) > 0 or current(team_id) is not None:
        return
    raise UnknownTeam(
        f"team {team_id!r} has no documents in the source registry and no collection: "
        "nothing to reindex (check the team id); to build an empty collection for it on "
        'purpose pass --allow-empty (POST /admin/reindex: "allow_empty": true)',
        hint='check the team id, or send "allow_empty": true to build an empty collection',
        field="team_id",
    )
