"""Ingestion jobs: documents accepted for indexing in the background (``202 Accepted``).

A request whose documents are too long to index within one HTTP request's time is stored here
first, answered with a job id, and indexed by whichever gateway replica claims it. The row
holds the validated documents until the job is done, so an accepted document is never lost: a
replica that dies mid-job stops renewing its lease, and another replica (or the same one after
a restart) claims the job again — ingestion is idempotent per document, so a second run
finishes what the first started.

It lives in the state database (``state.url``), beside the source registry. Statuses:
``queued`` → ``running`` → ``done`` | ``failed``; a job whose backend was unavailable goes back
to ``queued`` with a ``retry_at`` and is retried. Synchronous (callers run it in a thread).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from batch_ingest.documents import SourceDocument

JobStatus = Literal["queued", "running", "done", "failed"]


@dataclass(frozen=True)
class IngestJob:
    job_id: str
    subject: str
    team_ids: tuple[str, ...]
    status: JobStatus
    documents: int
    chars: int
    attempts: int
    trace_id: str
    created_at: datetime
    updated_at: datetime
    result: dict[str, Any] | None = None
    error: str = ""


class IngestJobs:
    """The job table of the state database behind ``engine``."""

    def __init__(self, engine: Engine, table: str = "ingest_jobs") -> None:
        self.engine = engine
        metadata = sa.MetaData()
        self.table = sa.Table(
            table,
            metadata,
            sa.Column("job_id", sa.String(32), primary_key=True),
            sa.Column("subject", sa.String(256), nullable=False),
            sa.Column("team_ids", sa.Text, nullable=False),
            sa.Column("status", sa.String(16), nullable=False, index=True),
            sa.Column("payload", sa.Text, nullable=True),  # the documents, until done
            sa.Column("documents", sa.Integer, nullable=False),
            sa.Column("chars", sa.BigInteger, nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False, default=0),
            sa.Column("trace_id", sa.String(64), nullable=False),
            sa.Column("owner", sa.String(128), nullable=True),
            sa.Column("lease_expires", sa.DateTime(timezone=True), nullable=True),
            sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("result", sa.Text, nullable=True),
            sa.Column("error", sa.Text, nullable=False, default=""),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        )
        metadata.create_all(engine, checkfirst=True)

    # --- writes -------------------------------------------------------------------------
    def submit(self, docs: list[SourceDocument], subject: str, trace_id: str) -> IngestJob:
        """Store ``docs`` as a queued job; returns it."""
        now = datetime.now(UTC)
        job_id = uuid.uuid4().hex
        values = {
            "job_id": job_id,
            "subject": subject,
            "team_ids": ",".join(sorted({d.team_id for d in docs})),
            "status": "queued",
            "payload": json.dumps([d.model_dump(mode="json") for d in docs]),
            "documents": len(docs),
            "chars": sum(len(d.text) for d in docs),
            "attempts": 0,
            "trace_id": trace_id,
            "error": "",
            "created_at": now,
            "updated_at": now,
        }
        with self.engine.begin() as conn:
            conn.execute(sa.insert(self.table).values(**values))
        job = self.get(job_id)
        assert job is not None
        return job

    def claim(self, owner: str, lease_s: float) -> tuple[IngestJob, list[SourceDocument]] | None:
        """Take the oldest runnable job (queued and due, or running with an expired lease) for
        ``owner``; ``None`` when there is none or another claimer won it."""
        t = self.table
        now = datetime.now(UTC)
        runnable = sa.or_(
            sa.and_(t.c.status == "queued", sa.or_(t.c.retry_at.is_(None), t.c.retry_at <= now)),
            sa.and_(t.c.status == "running", t.c.lease_expires < now),
        )
        with self.engine.begin() as conn:
            job_id = conn.execute(
                sa.select(t.c.job_id).where(runnable).order_by(t.c.created_at).limit(1)
            ).scalar()
            if job_id is None:
                return None
            taken = conn.execute(
                sa.update(t)
                .where(t.c.job_id == job_id, runnable)
                .values(
                    status="running",
                    owner=owner,
                    lease_expires=now + timedelta(seconds=lease_s),
                    attempts=t.c.attempts + 1,
                    updated_at=now,
                )
            ).rowcount
            if not taken:
                return None
            payload = conn.execute(sa.select(t.c.payload).where(t.c.job_id == job_id)).scalar()
        job = self.get(job_id)
        assert job is not None
        docs = [SourceDocument.model_validate(d) for d in json.loads(payload or "[]")]
        return job, docs

    def renew(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Extend ``owner``'s lease; False when the job is no longer theirs."""
        now = datetime.now(UTC)
        return self._update(
            job_id, owner, lease_expires=now + timedelta(seconds=lease_s), updated_at=now
        )

    def finish(self, job_id: str, owner: str, result: dict[str, Any]) -> bool:
        """Mark the job done with its result; the stored documents are dropped."""
        return self._update(
            job_id,
            owner,
            status="done",
            payload=None,
            result=json.dumps(result),
            lease_expires=None,
            updated_at=datetime.now(UTC),
        )

    def fail(self, job_id: str, owner: str, error: str) -> bool:
        """Mark the job failed for good (the documents stay, for an operator to look at)."""
        return self._update(
            job_id,
            owner,
            status="failed",
            error=error,
            lease_expires=None,
            updated_at=datetime.now(UTC),
        )

    def retry_later(self, job_id: str, owner: str, error: str, delay_s: float) -> bool:
        """Put the job back in the queue, due again after ``delay_s`` seconds."""
        now = datetime.now(UTC)
        return self._update(
            job_id,
            owner,
            status="queued",
            error=error,
            owner=None,
            lease_expires=None,
            retry_at=now + timedelta(seconds=delay_s),
            updated_at=now,
        )

    def _update(self, job_id: str, claimer: str, **values: Any) -> bool:
        """Change the job only while ``claimer`` holds it."""
        t = self.table
        with self.engine.begin() as conn:
            return bool(
                conn.execute(
                    sa.update(t)
                    .where(t.c.job_id == job_id, t.c.owner == claimer, t.c.status == "running")
                    .values(**values)
                ).rowcount
            )

    # --- reads --------------------------------------------------------------------------
    def get(self, job_id: str) -> IngestJob | None:
        t = self.table
        columns = [c for c in t.c if c.name != "payload"]
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(*columns).where(t.c.job_id == job_id)).first()
        if row is None:
            return None
        return IngestJob(
            job_id=row.job_id,
            subject=row.subject,
            team_ids=tuple(x for x in row.team_ids.split(",") if x),
            status=row.status,
            documents=row.documents,
            chars=row.chars,
            attempts=row.attempts,
            trace_id=row.trace_id,
            created_at=_aware(row.created_at),
            updated_at=_aware(row.updated_at),
            result=json.loads(row.result) if row.result else None,
            error=row.error or "",
        )

    def pending(self) -> int:
        """Jobs not finished yet (queued or running)."""
        t = self.table
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).where(t.c.status.in_(("queued", "running")))
                ).scalar()
                or 0
            )


def _aware(value: datetime) -> datetime:
    # SQLite returns naive datetimes for timezone-aware columns.
    return value if value.tzinfo else value.replace(tzinfo=UTC)
