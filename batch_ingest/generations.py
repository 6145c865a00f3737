"""The index generation of each team: a counter every writer raises after it changes what a
search of the team can find (ingest, delete, reindex swap, graph upsert), so anything keyed by
it — the gateway's semantic cache — is stale from that moment on, in every process.

It lives in the state database (``state.url``, beside the source registry), the one store the
gateway, the bus consumer and the reindex job already share. One row per team."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

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
        # A SQLite file is also read directly, never waiting (``read_now``).
        url = engine.url
        file = url.database if url.get_backend_name() == "sqlite" else None
        self._file = file if file not in (None, "", ":memory:") else None
        self._direct: sqlite3.Connection | None = None
        self._direct_lock = threading.Lock()

    def get(self, team_id: str) -> int:
        """The team's generation; 0 for a team never written."""
        with self.engine.connect() as conn:
            value = conn.execute(self._read, {"team_id": team_id}).scalar()
        return int(value or 0)

    def read_now(self, team_id: str) -> int | None:
        """The team's generation if it can be read without waiting (a SQLite file not locked
        by a writer's commit: a few microseconds, no worker thread needed); None otherwise
        (another backend, a lock, an error) — then ``get`` is the read to make.

        A read-only connection in autocommit mode: each read sees every commit made before
        it, as ``get`` does (a write acknowledged before a search began is seen)."""
        if self._file is None or not self._direct_lock.acquire(blocking=False):
            return None
        try:
            if self._direct is None:
                self._direct = sqlite3.connect(
                    Path(self._file).resolve().as_uri() + "?mode=ro",
                    uri=True,
                    timeout=0,  # a locked database answers at once: no wait on the caller
                    isolation_level=None,
                    check_same_thread=False,
                )
            row = self._direct.execute(
                f'SELECT generation FROM "{self.table.name}" WHERE team_id = ?', (team_id,)
            ).fetchone()
        except sqlite3.Error:
            return None
        finally:
            self._direct_lock.release()
        return int(row[0]) if row is not None else 0

    def bump(self, team_ids: Iterable[str]) -> None:
        """Raise the generation of each team by one (creating its row at 1)."""
        for team_id in sorted(set(team_ids)):
            values = {"updated_at": datetime.now(UTC)}
            increment(self.engine, self.table, {"team_id": team_id}, {"generation": 1}, values)
