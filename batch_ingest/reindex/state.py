"""Job records of ``batch_ingest.reindex``, in the same database as the source registry.

Two tables beside ``source_documents`` (``state.url``: SQLite by default, PostgreSQL in a
cluster, so the admin API on any Serve replica reads what a Ray task on any node writes):

- ``reindex_jobs``: one row per job: team, status, the version it builds and the one it
  replaces, counts, progress (rate, ETA), the error of a failed run and the heartbeat of
  its driver (``heartbeat_at``, written by ``batch_ingest.reindex.heartbeat`` alone).
- ``reindex_docs``: the documents a job has written into its target version, with their chunk
  counts (the expected row count is their sum). ``--resume`` skips them without re-reading
  Milvus; documents written but not yet recorded (a crash in between) are found by primary-key
  lookup of their deterministic chunk ids.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from deployments.errors import GatewayError


class JobStatus(StrEnum):
    """queued → running → switching → succeeded; failed from any of them (resumable);
    superseded when a newer job of the team replaces an unfinished one.

    ``stalled`` is never stored: readers show it for a queued, running or switching row whose
    driver stopped beating (``batch_ingest.reindex.liveness``)."""

    QUEUED = "queued"
    RUNNING = "running"
    SWITCHING = "switching"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    STALLED = "stalled"


# The moves a job may make. A resumed job runs again (from failed, or from a status its dead
# process left behind); one that crashed after its alias switch resumes straight into the
# clean-up and succeeds. Succeeded and superseded are final.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.SUPERSEDED}),
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.RUNNING,
            JobStatus.SWITCHING,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.SUPERSEDED,
        }
    ),
    JobStatus.SWITCHING: frozenset(
        {JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.SUPERSEDED}
    ),
    JobStatus.FAILED: frozenset(
        {JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.SUPERSEDED}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.SUPERSEDED: frozenset(),
    # What a stalled job (its row still says queued/running/switching) may become: resumed,
    # failed or superseded. Such a row is never saved as "stalled".
    JobStatus.STALLED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.SUPERSEDED}),
}
ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SWITCHING)
STATUSES = tuple(JobStatus)


class IllegalTransition(GatewayError):
    """A job was asked to move where ``TRANSITIONS`` does not allow (a bug, not bad input)."""

    code = "illegal_transition"


@dataclass
class ReindexJob:
    job_id: str
    team_id: str
    status: JobStatus = JobStatus.QUEUED
    embed_model: str = ""
    source_version: int | None = None
    target_version: int | None = None
    total_docs: int = 0
    done_docs: int = 0
    skipped_docs: int = 0
    expected_chunks: int = 0
    written_chunks: int = 0
    rows_in_target: int | None = None
    rate_chunks_s: float = 0.0
    eta_s: float | None = None
    error: str | None = None
    # What a running job waits on before its first batch (e.g. CPUs held by Serve replicas);
    # None while it makes progress.
    note: str | None = None
    snapshot_at: datetime | None = None
    options: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    # The driver's last sign of life (``None``: never started, or written before heartbeats).
    heartbeat_at: datetime | None = None

    def __post_init__(self) -> None:
        self.status = JobStatus(self.status)

    @property
    def finished(self) -> bool:
        return not TRANSITIONS[self.status]

    def move_to(self, status: JobStatus, error: str | None = None) -> None:
        """Change status (and error: ``None`` clears it), or raise ``IllegalTransition``."""
        if status not in TRANSITIONS[self.status]:
            raise IllegalTransition(f"job {self.job_id}: {self.status} → {status} is not allowed")
        self.status, self.error = status, error

    def public(self) -> dict[str, Any]:
        """JSON-ready view for the admin API."""
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, datetime):
                out[key] = value.isoformat()
        out["progress"] = round(self.done_docs / self.total_docs, 4) if self.total_docs else None
        return out


def _tables(metadata: sa.MetaData) -> tuple[sa.Table, sa.Table]:
    jobs = sa.Table(
        "reindex_jobs",
        metadata,
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("team_id", sa.String(128), nullable=False, index=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("embed_model", sa.String(256), nullable=False, default=""),
        sa.Column("source_version", sa.Integer, nullable=True),
        sa.Column("target_version", sa.Integer, nullable=True),
        sa.Column("total_docs", sa.Integer, nullable=False, default=0),
        sa.Column("done_docs", sa.Integer, nullable=False, default=0),
        sa.Column("skipped_docs", sa.Integer, nullable=False, default=0),
        sa.Column("expected_chunks", sa.Integer, nullable=False, default=0),
        sa.Column("written_chunks", sa.Integer, nullable=False, default=0),
        sa.Column("rows_in_target", sa.Integer, nullable=True),
        sa.Column("rate_chunks_s", sa.Float, nullable=False, default=0.0),
        sa.Column("eta_s", sa.Float, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("note", sa.Text, nullable=True),
        sa.Column("snapshot_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("options", sa.Text, nullable=False, default="{}"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
    )
    docs = sa.Table(
        "reindex_docs",
        metadata,
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("doc_type", sa.String(32), primary_key=True),
        sa.Column("doc_id", sa.String(256), primary_key=True),
        sa.Column("chunks", sa.Integer, nullable=False),
    )
    return jobs, docs


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class ReindexState:
    """Job rows and done-document rows over a SQLAlchemy engine (the SourceStore's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.metadata = sa.MetaData()
        self.jobs, self.docs = _tables(self.metadata)
        self.metadata.create_all(engine, checkfirst=True)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Columns added after a database was created (``note``, ``heartbeat_at``) are added
        to it: nullable, so the rows already there stay valid."""
        present = {c["name"] for c in sa.inspect(self.engine).get_columns(self.jobs.name)}
        with self.engine.begin() as conn:
            for column in self.jobs.columns:
                if column.name not in present and column.nullable:
                    kind = column.type.compile(dialect=self.engine.dialect)
                    conn.execute(
                        sa.text(f"ALTER TABLE {self.jobs.name} ADD COLUMN {column.name} {kind}")
                    )

    # --- jobs ----------------------------------------------------------------------------
    def create(self, team_id: str, options: dict[str, Any] | None = None) -> ReindexJob:
        now = datetime.now(UTC)
        job = ReindexJob(
            job_id=uuid.uuid4().hex,
            team_id=team_id,
            options=dict(options or {}),
            created_at=now,
            updated_at=now,
        )
        values = self._values(job)
        with self.engine.begin() as conn:
            conn.execute(sa.insert(self.jobs).values(**values))
        return job

    def get(self, job_id: str) -> ReindexJob | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.jobs).where(self.jobs.c.job_id == job_id)).first()
        return self._job(row) if row is not None else None

    def unfinished(self, team_id: str) -> list[ReindexJob]:
        """The team's jobs that neither succeeded nor were superseded, newest first (a failed
        job is unfinished: it can be resumed)."""
        t = self.jobs
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t)
                .where(t.c.team_id == team_id, t.c.status.in_((*ACTIVE, JobStatus.FAILED)))
                .order_by(t.c.created_at.desc())
            ).all()
        return [self._job(r) for r in rows]

    def latest(self, team_id: str) -> ReindexJob | None:
        """The team's newest job, whatever its status."""
        t = self.jobs
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t).where(t.c.team_id == team_id).order_by(t.c.created_at.desc())
            ).first()
        return self._job(row) if row is not None else None

    def save(self, job: ReindexJob) -> None:
        """Write the row (all but ``heartbeat_at``, which only ``beat`` writes)."""
        job.updated_at = datetime.now(UTC)
        values = self._values(job)
        values.pop("job_id")
        values.pop("created_at")
        values.pop("heartbeat_at")
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(self.jobs).where(self.jobs.c.job_id == job.job_id).values(**values)
            )

    def beat(self, job_id: str, seen: datetime | None) -> datetime | None:
        """Set the job's ``heartbeat_at`` to now if it still is ``seen`` (compare-and-set:
        of two drivers claiming one job, or a driver taken over, one wins). Returns the time
        written, or ``None`` when the heartbeat had changed (another driver has the job)."""
        t = self.jobs
        now = datetime.now(UTC)
        same = t.c.heartbeat_at.is_(None) if seen is None else t.c.heartbeat_at == seen
        with self.engine.begin() as conn:
            changed = conn.execute(
                sa.update(t).where(t.c.job_id == job_id, same).values(heartbeat_at=now)
            ).rowcount
        return now if changed else None

    # --- done documents ----------------------------------------------------------------------
    def done(self, job_id: str) -> dict[tuple[str, str], int]:
        t = self.docs
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.doc_type, t.c.doc_id, t.c.chunks).where(t.c.job_id == job_id)
            ).all()
        return {(r.doc_type, r.doc_id): int(r.chunks) for r in rows}

    def mark_done(self, job_id: str, docs: dict[tuple[str, str], int]) -> None:
        """Record (or update) written documents with their chunk counts."""
        if not docs:
            return
        t = self.docs
        with self.engine.begin() as conn:
            keys = list(docs)
            for start in range(0, len(keys), 200):
                part = keys[start : start + 200]
                conn.execute(
                    sa.delete(t).where(
                        t.c.job_id == job_id,
                        sa.tuple_(t.c.doc_type, t.c.doc_id).in_(part),
                    )
                )
                conn.execute(
                    sa.insert(t),
                    [
                        {"job_id": job_id, "doc_type": k[0], "doc_id": k[1], "chunks": docs[k]}
                        for k in part
                    ],
                )

    def unmark(self, job_id: str, keys: list[tuple[str, str]]) -> None:
        t = self.docs
        with self.engine.begin() as conn:
            for start in range(0, len(keys), 200):
                conn.execute(
                    sa.delete(t).where(
                        t.c.job_id == job_id,
                        sa.tuple_(t.c.doc_type, t.c.doc_id).in_(keys[start : start + 200]),
                    )
                )

    def forget(self, job_id: str) -> None:
        """Drop a finished job's document rows (the job row stays as its history)."""
        with self.engine.begin() as conn:
            conn.execute(sa.delete(self.docs).where(self.docs.c.job_id == job_id))

    # --- rows ------------------------------------------------------------------------------
    def _values(self, job: ReindexJob) -> dict[str, Any]:
        if job.status is JobStatus.STALLED:
            raise IllegalTransition(f"job {job.job_id}: 'stalled' is shown, never stored")
        values = asdict(job)
        values["options"] = json.dumps(job.options, sort_keys=True)
        return values

    def _job(self, row: Any) -> ReindexJob:
        data = dict(row._mapping)
        data["options"] = json.loads(data.get("options") or "{}")
        for key in ("snapshot_at", "created_at", "updated_at", "finished_at", "heartbeat_at"):
            data[key] = _aware(data.get(key))
        return ReindexJob(**data)
