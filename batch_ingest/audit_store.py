"""The audit log's records and their table: one schema for SQLite (the default, a file under
var/) and PostgreSQL (``audit.url``), written with SQLAlchemy Core. Shared by the gateway's
audit log (serve_app/audit/log.py: a queue and a writer thread) and the bus consumer, which writes
the record of every bus write before applying it (batch_ingest/events/bus_audit.py)."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from batch_ingest.sql import resolve_url

logger = logging.getLogger(__name__)

DECISIONS = ("allow", "deny")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class AuditRecord:
    """One decision. ``decision`` is ``allow`` or ``deny``; ``reason`` a short code."""

    action: str
    decision: str
    reason: str
    http_status: int
    ts: datetime = field(default_factory=utcnow)
    trace_id: str = ""
    subject: str = ""
    auth_method: str = ""
    key_id: str = ""
    agent_id: str = ""
    declared_agent_id: str = ""
    team_id: str = ""
    resource: str = ""
    query_sha256: str | None = None
    query_text: str | None = None
    doc_ids: list[str] | None = None
    chunk_ids: list[str] | None = None
    # The caller's verified groups: what its document-ACL decisions were made with.
    groups: list[str] | None = None
    latency_ms: float | None = None
    path: str = ""


class UTCDateTime(sa.types.TypeDecorator):
    """Timestamps stored in UTC on every backend and always read back timezone-aware."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        # SQLite has no timezone type; naive UTC strings keep the order of the index.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def build_table(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("ts", UTCDateTime(), nullable=False),
        sa.Column("trace_id", sa.String(128), nullable=False, default=""),
        sa.Column("subject", sa.String(256), nullable=False, default=""),
        sa.Column("auth_method", sa.String(16), nullable=False, default=""),
        sa.Column("key_id", sa.String(128), nullable=False, default=""),
        sa.Column("agent_id", sa.String(256), nullable=False, default=""),
        sa.Column("declared_agent_id", sa.String(256), nullable=False, default=""),
        sa.Column("team_id", sa.String(256), nullable=False, default=""),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False, default=""),
        sa.Column("decision", sa.String(8), nullable=False),
        sa.Column("reason", sa.String(256), nullable=False, default=""),
        sa.Column("http_status", sa.SmallInteger(), nullable=False),
        sa.Column("query_sha256", sa.String(64), nullable=True),
        sa.Column("query_text", sa.Text(), nullable=True),
        sa.Column("doc_ids", sa.JSON(), nullable=True),
        sa.Column("chunk_ids", sa.JSON(), nullable=True),
        sa.Column("groups", sa.JSON(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("path", sa.String(256), nullable=False, default=""),
        sa.CheckConstraint("decision IN ('allow', 'deny')", name=f"{name}_decision_ck"),
        sa.Index(f"ix_{name}_ts", "ts"),
        sa.Index(f"ix_{name}_subject_ts", "subject", "ts"),
        sa.Index(f"ix_{name}_decision_ts", "decision", "ts"),
        sa.Index(f"ix_{name}_team_ts", "team_id", "ts"),
    )


class AuditStore:
    """The table and its queries; synchronous (the writer thread and the CLI call it)."""

    def __init__(self, url: str, table: str = "audit_decisions", *, timeout_s: float = 5.0):
        self.url = resolve_url(url)
        backend = make_url(self.url).get_backend_name()
        connect_args: dict[str, Any] = {}
        if backend == "postgresql":
            connect_args = {"connect_timeout": max(1, int(timeout_s))}
        elif backend == "sqlite":
            connect_args = {"timeout": timeout_s, "check_same_thread": False}
        self.engine: Engine = sa.create_engine(
            self.url, pool_pre_ping=True, connect_args=connect_args
        )
        self.metadata = sa.MetaData()
        self.table = build_table(self.metadata, table)
        self._created = False
        self._create_lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    def create(self) -> None:
        """The table (and columns added since), once per store. The writer thread's first
        insert and a request's first query may both get here first; another process may
        create the table between the existence check and the CREATE: either way the table
        is there, which is all that is asked."""
        if self._created:
            return
        with self._create_lock:
            if self._created:
                return
            try:
                self.metadata.create_all(self.engine, checkfirst=True)
            except sa.exc.DBAPIError:
                if not sa.inspect(self.engine).has_table(self.table.name):
                    raise
            self._add_missing_columns()
            self._created = True

    def _add_missing_columns(self) -> None:
        """Columns added since a table was created (nullable ones only), so an audit
        database of an older gateway keeps being written."""
        present = {c["name"] for c in sa.inspect(self.engine).get_columns(self.table.name)}
        missing = [c for c in self.table.columns if c.name not in present]
        if not missing:
            return
        with self.engine.begin() as conn:
            for column in missing:
                kind = column.type.compile(dialect=self.engine.dialect)
                conn.execute(
                    sa.text(f'ALTER TABLE "{self.table.name}" ADD COLUMN "{column.name}" {kind}')
                )
                logger.info("audit table %s: added column %s", self.table.name, column.name)

    def insert(self, records: list[AuditRecord]) -> None:
        if not records:
            return
        self.create()
        with self.engine.begin() as conn:
            conn.execute(self.table.insert(), [asdict(r) for r in records])

    def prune(self, before: datetime, batch: int = 5000) -> int:
        """Delete up to ``batch`` of the oldest records with ``ts < before``, in one
        transaction; the number deleted (fewer than ``batch``: none older is left)."""
        self.create()
        t = self.table
        # The oldest ids by the ts index, then deleted by primary key.
        oldest = sa.select(t.c.id).where(t.c.ts < before).order_by(t.c.ts).limit(batch)
        with self.engine.begin() as conn:
            ids = [row[0] for row in conn.execute(oldest)]
            if ids:
                conn.execute(t.delete().where(t.c.id.in_(ids)))
        return len(ids)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def query(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        subject: str | None = None,
        decision: str | None = None,
        team_id: str | None = None,
        limit: int = 100,
        *,
        action: str | None = None,
        trace_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Records with ``since <= ts < until`` matching the other filters, newest first."""
        if decision is not None and decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}, got {decision!r}")
        self.create()
        t = self.table
        stmt = sa.select(t)
        for column, value in (
            (t.c.subject, subject),
            (t.c.decision, decision),
            (t.c.team_id, team_id),
            (t.c.action, action),
            (t.c.trace_id, trace_id),
        ):
            if value is not None:
                stmt = stmt.where(column == value)
        if since is not None:
            stmt = stmt.where(t.c.ts >= since)
        if until is not None:
            stmt = stmt.where(t.c.ts < until)
        stmt = stmt.order_by(t.c.ts.desc(), t.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt)]

    def dispose(self) -> None:
        self.engine.dispose()
