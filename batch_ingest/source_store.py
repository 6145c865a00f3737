"""The registry of source documents: what was ingested, at which version, and its text.

Milvus holds chunks (text cut with overlap, plus a context header); re-chunking a tenant with a
new model or chunker needs the documents themselves, and ordering events needs the last
version applied per document. Both live here, one row per ``(team_id, doc_type, doc_id)``:
the validated ``SourceDocument`` as JSON, the event ``version`` it came with (``None`` for
API ingestion), and a tombstone after a delete (so an older upsert delivered late cannot bring
the document back).

One schema for SQLite (the default, ``var/state.db``) and PostgreSQL (``state.url``), written
with SQLAlchemy Core; synchronous (callers run it in a thread).

Readers: ``batch_ingest.reindex`` (``iter_team``); writers: the ingestion pipeline after a
document is indexed (``put``) or deleted (``tombstone``). ``should_apply`` is the version check
of the event consumer.

Several writers (consumer replicas, gateway replicas taking ``POST /ingest/events``) may hold
events of one document at once. Checking the stored version and writing the new one are two
steps with the Milvus and graph writes between them, so the event path first takes a *lease*
on each document (``claim``: a row in ``source_documents_leases``, taken by an INSERT or by a
conditional UPDATE of an expired one; atomic in SQLite and PostgreSQL alike), checks and
writes under it, and gives it back (``release``). A crashed writer's lease expires after its
time to live.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError

from batch_ingest.documents import SourceDocument
from batch_ingest.sql import resolve_url

Key = tuple[str, str, str]  # (team_id, doc_type, doc_id)


@dataclass(frozen=True)
class SourceRow:
    team_id: str
    doc_type: str
    doc_id: str
    version: int | None
    deleted: bool
    document: SourceDocument | None
    updated_at: datetime


def key_columns() -> list[sa.Column]:
    """The document key, the primary key of both tables."""
    return [
        sa.Column("team_id", sa.String(128), primary_key=True),
        sa.Column("doc_type", sa.String(32), primary_key=True),
        sa.Column("doc_id", sa.String(256), primary_key=True),
    ]


def build_leases(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        *key_columns(),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def build_table(metadata: sa.MetaData, name: str = "source_documents") -> sa.Table:
    return sa.Table(
        name,
        metadata,
        *key_columns(),
        sa.Column("version", sa.BigInteger, nullable=True),
        sa.Column("deleted", sa.Boolean, nullable=False, default=False),
        sa.Column("document", sa.Text, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


class SourceStore:
    """Source documents by key, with versions and tombstones.

    Args:
        url: SQLAlchemy URL; a relative SQLite path is relative to the repository root.
    """

    def __init__(self, url: str = "sqlite:///var/state.db", table: str = "source_documents"):
        self.url = resolve_url(url)
        backend = make_url(self.url).get_backend_name()
        connect_args: dict[str, Any] = {}
        if backend == "sqlite":
            connect_args = {"timeout": 30, "check_same_thread": False}
        elif backend == "postgresql":
            connect_args = {"connect_timeout": 5}
        self.engine: Engine = sa.create_engine(
            self.url, pool_pre_ping=True, connect_args=connect_args
        )
        self.metadata = sa.MetaData()
        self.table = build_table(self.metadata, table)
        self.leases = build_leases(self.metadata, f"{table}_leases")
        self.metadata.create_all(self.engine, checkfirst=True)

    # --- reads -------------------------------------------------------------------------------
    def get(self, key: Key) -> SourceRow | None:
        t = self.table
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t).where(_is_key(t, key))).first()
        return _row(row) if row is not None else None

    def should_apply(self, key: Key, version: int | None) -> bool:
        """Whether an event of ``version`` for ``key`` is new: no version (API ingestion)
        always applies; otherwise it must be newer than the stored one (an equal version is a
        redelivery, an older one arrived out of order)."""
        if version is None:
            return True
        row = self.get(key)
        return row is None or row.version is None or version > row.version

    def iter_team(self, team_id: str, batch: int = 500) -> Iterator[SourceDocument]:
        """Every live (not deleted) document of a team, in key order, streamed."""
        t = self.table
        last: tuple[str, str] = ("", "")
        while True:
            query = (
                sa.select(t.c.doc_type, t.c.doc_id, t.c.document)
                .where(t.c.team_id == team_id, t.c.deleted.is_(False))
                .where(sa.tuple_(t.c.doc_type, t.c.doc_id) > sa.tuple_(*last))
                .order_by(t.c.doc_type, t.c.doc_id)
                .limit(batch)
            )
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
            if not rows:
                return
            for doc_type, doc_id, document in rows:
                yield SourceDocument.model_validate_json(document)
                last = (doc_type, doc_id)

    def changed_since(self, team_id: str, since: datetime) -> list[SourceRow]:
        """The team's rows (live and tombstones) written at or after ``since``: what a
        reindex running since then must catch up on."""
        t = self.table
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t)
                .where(t.c.team_id == team_id, t.c.updated_at >= since)
                .order_by(t.c.doc_type, t.c.doc_id)
            ).all()
        return [_row(r) for r in rows]

    def teams(self) -> list[str]:
        """Every team with a live document, sorted."""
        t = self.table
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.team_id).where(t.c.deleted.is_(False)).distinct()
            ).scalars()
            return sorted(rows)

    def count(self, team_id: str) -> int:
        t = self.table
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(t)
                    .where(t.c.team_id == team_id, t.c.deleted.is_(False))
                ).scalar_one()
            )

    # --- leases ------------------------------------------------------------------------------
    def claim(self, keys: list[Key], owner: str, ttl_s: float = 300.0) -> set[Key]:
        """Take the lease of each key that is free, expired or already ``owner``'s; returns
        the keys now held. Each key is one atomic statement: an INSERT (the primary key
        refuses a second holder) or an UPDATE conditional on expiry or ownership."""
        now = datetime.now(UTC)
        until = now + timedelta(seconds=ttl_s)
        t = self.leases
        held: set[Key] = set()
        for key in dict.fromkeys(keys):
            row = {"team_id": key[0], "doc_type": key[1], "doc_id": key[2]}
            try:
                with self.engine.begin() as conn:
                    conn.execute(sa.insert(t).values(**row, owner=owner, expires_at=until))
                held.add(key)
                continue
            except IntegrityError:
                pass
            with self.engine.begin() as conn:
                taken = conn.execute(
                    sa.update(t)
                    .where(_is_key(t, key), (t.c.expires_at < now) | (t.c.owner == owner))
                    .values(owner=owner, expires_at=until)
                ).rowcount
            if taken:
                held.add(key)
        return held

    def release(self, keys: list[Key], owner: str) -> None:
        """Give back the leases ``owner`` holds on ``keys`` (others' are left alone)."""
        t = self.leases
        with self.engine.begin() as conn:
            for key in dict.fromkeys(keys):
                conn.execute(sa.delete(t).where(_is_key(t, key), t.c.owner == owner))

    # --- writes ------------------------------------------------------------------------------
    def put(
        self,
        docs: list[SourceDocument],
        versions: dict[Key, int] | None = None,
        keep_version: frozenset[Key] | set[Key] = frozenset(),
    ) -> None:
        """Record indexed documents (upsert; clears a tombstone), with the event version of
        each where one came (``versions`` by key). A key in ``keep_version`` stores its text
        but keeps the version already recorded: the event was not fully applied (its graph
        write failed) and its redelivery must not look like a duplicate."""
        versions = versions or {}
        rows = []
        for d in docs:
            key = (d.team_id, d.doc_type, d.doc_id)
            row: dict[str, Any] = {
                "team_id": d.team_id,
                "doc_type": d.doc_type,
                "doc_id": d.doc_id,
                "deleted": False,
                "document": d.model_dump_json(),
            }
            if key not in keep_version:
                row["version"] = versions.get(key)
            rows.append(row)
        self._write(rows)

    def tombstone(self, key: Key, version: int | None = None) -> None:
        """Record that ``key`` was deleted (its text is dropped, its version kept)."""
        self._write(
            [
                {
                    "team_id": key[0],
                    "doc_type": key[1],
                    "doc_id": key[2],
                    "version": version,
                    "deleted": True,
                    "document": None,
                }
            ]
        )

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        now = datetime.now(UTC)
        t = self.table
        with self.engine.begin() as conn:
            for row in rows:
                values = {**row, "updated_at": now}
                key = _is_key(t, (row["team_id"], row["doc_type"], row["doc_id"]))
                updated = conn.execute(sa.update(t).where(key).values(**values)).rowcount
                if not updated:
                    conn.execute(sa.insert(t).values(**{"version": None, **values}))

    def set_version(self, key: Key, version: int | None) -> int | None:
        """Set the revision recorded for ``key`` (``None``: the next event of any revision
        applies) and return the one it had; ``KeyError`` when the registry has no such row.
        Only the operator path of ``python -m batch_ingest.revisions`` calls this."""
        t = self.table
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(t.c.version).where(_is_key(t, key))).first()
            if row is None:
                raise KeyError(key)
            conn.execute(
                sa.update(t)
                .where(_is_key(t, key))
                .values(version=version, updated_at=datetime.now(UTC))
            )
        return row.version

    def drop_team(self, team_id: str) -> int:
        t = self.table
        with self.engine.begin() as conn:
            conn.execute(sa.delete(self.leases).where(self.leases.c.team_id == team_id))
            return conn.execute(sa.delete(t).where(t.c.team_id == team_id)).rowcount

    def close(self) -> None:
        self.engine.dispose()


def _is_key(table: sa.Table, key: Key) -> sa.ColumnElement[bool]:
    """The row (document or lease) of ``key`` = (team_id, doc_type, doc_id), values bound."""
    return sa.and_(table.c.team_id == key[0], table.c.doc_type == key[1], table.c.doc_id == key[2])


def _row(row: Any) -> SourceRow:
    document = SourceDocument.model_validate(json.loads(row.document)) if row.document else None
    updated = row.updated_at
    if updated.tzinfo is None:
        updated = updated.replace(tzinfo=UTC)
    return SourceRow(
        row.team_id, row.doc_type, row.doc_id, row.version, bool(row.deleted), document, updated
    )
