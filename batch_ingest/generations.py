"""The index generation of each team: a counter every writer raises after it changes what a
search of the team can find (ingest, delete, reindex swap, graph upsert), so anything keyed by
it — the gateway's semantic cache — is stale from that moment on, in every process.

It lives in the state database (``state.url``, beside the source registry), the one store the
gateway, the bus consumer and the reindex job already share. One row per team."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from batch_ingest.sql import increment


class IndexGenerations:
    def __init__(self, engine: Engine, table: str = "team_generations") -> None:
        self.engine = engine
        metadata = sa.MetaData()
        self.table = sa.Table(
            table,
            metadata,
            sa.Column("team_id", sa.String(128), primary_key=True),
            sa.Column("generation", sa.BigInteger, nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        )
        metadata.create_all(engine, checkfirst=True)
        # Built once: the gateway reads a generation per search (~35 µs, against ~85 µs when
        # the statement was built on each read).
        t = self.table
        self._read = sa.select(t.c.generation).where(t.c.team_id == sa.bindparam("team_id"))

    def get(self, team_id: str) -> int:
        """The team's generation; 0 for a team never written."""
        with self.engine.connect() as conn:
            value = conn.execute(self._read, {"team_id": team_id}).scalar()
        return int(value or 0)

    def bump(self, team_ids: Iterable[str]) -> None:
        """Raise the generation of each team by one (creating its row at 1)."""
        for team_id in sorted(set(team_ids)):
            values = {"updated_at": datetime.now(UTC)}
            increment(self.engine, self.table, {"team_id": team_id}, {"generation": 1}, values)
