"""The embedding ledger: passage tokens and chunks embedded per team, per source and per UTC
day — the metering every writer records, whichever process it runs in.

The Prometheus counter ``rag_gateway_embedded_tokens`` (deployments/metrics.py) exists only
inside Serve replicas and restarts with them; the bus consumer and the reindex job's Ray Data
actors embed outside Serve. All of them share the state database (``state.url``), so the
ledger lives there, one row per ``(team_id, source, day)``: ``api`` (the gateway's
``POST /ingest/*`` and its background jobs), ``bus`` (batch_ingest.consumer), ``reindex``.
Read it with ``GET /admin/usage`` or ``python -m batch_ingest.usage``. Synchronous (callers
run it in a thread)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from batch_ingest.sql import increment

SOURCES = ("api", "bus", "reindex", "bulk")


@dataclass(frozen=True)
class UsageRow:
    team_id: str
    source: str
    day: str  # YYYY-MM-DD, UTC
    tokens: int
    chunks: int


class EmbeddingUsage:
    def __init__(self, engine: Engine, table: str = "embedding_usage") -> None:
        self.engine = engine
        metadata = sa.MetaData()
        self.table = sa.Table(
            table,
            metadata,
            sa.Column("team_id", sa.String(128), primary_key=True),
            sa.Column("source", sa.String(16), primary_key=True),
            sa.Column("day", sa.String(10), primary_key=True),
            sa.Column("tokens", sa.BigInteger, nullable=False),
            sa.Column("chunks", sa.BigInteger, nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        )
        metadata.create_all(engine, checkfirst=True)

    def add(self, source: str, by_team: dict[str, tuple[int, int]]) -> None:
        """Add ``(tokens, chunks)`` per team to today's row of ``source``."""
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        now = datetime.now(UTC)
        day = now.date().isoformat()
        for team_id, (tokens, chunks) in sorted(by_team.items()):
            if tokens <= 0 and chunks <= 0:
                continue
            increment(
                self.engine,
                self.table,
                {"team_id": team_id, "source": source, "day": day},
                {"tokens": tokens, "chunks": chunks},
                {"updated_at": now},
            )

    def rows(
        self, team_id: str | None = None, since: str | None = None, until: str | None = None
    ) -> list[UsageRow]:
        """Rows of one team (or all), days ``since``..``until`` inclusive (YYYY-MM-DD)."""
        t = self.table
        query = sa.select(t.c.team_id, t.c.source, t.c.day, t.c.tokens, t.c.chunks)
        if team_id is not None:
            query = query.where(t.c.team_id == team_id)
        if since:
            query = query.where(t.c.day >= since)
        if until:
            query = query.where(t.c.day <= until)
        with self.engine.connect() as conn:
            result = conn.execute(query.order_by(t.c.team_id, t.c.day, t.c.source))
            return [
                UsageRow(r.team_id, r.source, r.day, int(r.tokens), int(r.chunks)) for r in result
            ]


def main(argv: list[str] | None = None) -> int:
    """Print the ledger as JSON lines: ``python -m batch_ingest.usage [--team T] [--since D]``."""
    from batch_ingest.settings import BatchSettings
    from batch_ingest.sql import resolve_url

    parser = argparse.ArgumentParser(description="Embedded tokens per team, source and day")
    parser.add_argument("--team", default=None)
    parser.add_argument("--since", default=None, help="first day, YYYY-MM-DD")
    parser.add_argument("--until", default=None, help="last day, YYYY-MM-DD")
    parser.add_argument("--state-url", default=None, help="default: STATE__URL")
    args = parser.parse_args(argv)
    url = resolve_url(args.state_url or BatchSettings().state.url)
    usage = EmbeddingUsage(sa.create_engine(url))
    for row in usage.rows(args.team, args.since, args.until):
        print(json.dumps(asdict(row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
