"""Whether a job's driver is alive, from its heartbeat, and how readers show a dead one.

The rule: a queued, running or switching job is alive while its last sign of life (its
``heartbeat_at``; a row written before heartbeats existed, or never started, has its
``updated_at`` instead) is younger than ``stale_after_s``. Otherwise its process is gone:
readers show it as ``stalled`` (never ``running`` with an ETA), it can be resumed, and it no
longer blocks a new job of its team.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from batch_ingest.reindex.state import ACTIVE, JobStatus, ReindexJob


def last_sign_of_life(job: ReindexJob) -> datetime | None:
    return job.heartbeat_at or job.updated_at or job.created_at


def silent_for(job: ReindexJob, now: datetime | None = None) -> float | None:
    """Seconds since the job's last sign of life (``None``: none recorded)."""
    last = last_sign_of_life(job)
    if last is None:
        return None
    return ((now or datetime.now(UTC)) - last).total_seconds()


def is_alive(job: ReindexJob, stale_after_s: float, now: datetime | None = None) -> bool:
    """An active job whose driver gave a sign of life within ``stale_after_s``."""
    age = silent_for(job, now)
    return job.status in ACTIVE and age is not None and age < stale_after_s


def is_stalled(job: ReindexJob, stale_after_s: float, now: datetime | None = None) -> bool:
    """An active job whose driver stopped beating (its row says queued/running/switching)."""
    return job.status in ACTIVE and not is_alive(job, stale_after_s, now)


def stalled_note(job: ReindexJob, now: datetime | None = None) -> str:
    last = last_sign_of_life(job)
    since = last.isoformat(timespec="seconds") if last else "its start"
    age = silent_for(job, now)
    ago = f" ({age:.0f}s ago)" if age is not None else ""
    was = job.status.value
    command = f"python -m batch_ingest.reindex --team {job.team_id}"
    if job.status is JobStatus.SWITCHING:
        how = f"finish it with `{command} --resume` (it was switching the alias)"
    else:
        how = (
            f"continue it with `{command} --resume`, or drop its half-built version with "
            f"`{command} --clean-up`"
        )
    return f"no heartbeat since {since}{ago}: its process is gone (was {was}); {how}"


def present(job: ReindexJob, stale_after_s: float, now: datetime | None = None) -> ReindexJob:
    """The job as readers show it: a stalled one as ``stalled`` with no ETA and a note saying
    since when it is silent and how to continue; any other as it is. Never saved."""
    if not is_stalled(job, stale_after_s, now):
        return job
    return replace(job, status=JobStatus.STALLED, eta_s=None, note=stalled_note(job, now))
