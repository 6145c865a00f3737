"""Half-built target versions of jobs that will not finish: dropped, never the live one.

- ``retire``: supersede one unfinished job and drop its target (a new job replaces it, or
  ``--clean-up`` asked for it).
- ``drop_unusable_target``: a job that failed in a way ``--resume`` cannot use (a failed
  verification: resuming would skip the recorded documents and fail the same way; see
  ``unresumable``) loses its target and its done records at once; a resume rebuilds from
  scratch. Any other failure (a crash, a backend away, no CPUs) keeps it for ``--resume``.
- ``clean_up`` (``python -m batch_ingest.reindex --team T --clean-up``): every unfinished job
  of the team whose driver is dead is superseded and its target dropped; with no job of the
  team alive, versions above the live one (left by a drop that failed) go too. Alive jobs,
  and a dead one that was switching its alias (resume it), are left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from batch_ingest.reindex.liveness import is_alive
from batch_ingest.reindex.options import VerificationFailed
from batch_ingest.reindex.state import JobStatus, ReindexJob, ReindexState
from deployments.vector_store.versions import CollectionVersions

logger = logging.getLogger("batch_ingest.reindex")


def retire(
    state: ReindexState, versions: CollectionVersions, job: ReindexJob, reason: str
) -> int | None:
    """Supersede ``job`` and drop its target unless it is live; the dropped version or None."""
    job.move_to(JobStatus.SUPERSEDED, reason)
    job.eta_s = None
    job.finished_at = datetime.now(UTC)
    state.save(job)
    dropped = None
    target = job.target_version
    live = versions.current(job.team_id)
    if target is not None and target != live and versions.drop(job.team_id, target):
        dropped = target
    state.forget(job.job_id)
    return dropped


def unresumable(error: BaseException) -> bool:
    """Whether a job that failed with ``error`` left a target ``--resume`` cannot use: a
    failed verification (``VerificationFailed``)."""
    return isinstance(error, VerificationFailed)


def drop_unusable_target(
    state: ReindexState, versions: CollectionVersions, job: ReindexJob
) -> None:
    """Drop the failed ``job``'s target (never the live version) and forget its done
    documents; the job's ``error`` says so. A failure here is logged, not raised: the job's
    own failure is what its caller reports."""
    target = job.target_version
    if target is None:
        return
    try:
        if target == versions.current(job.team_id):
            return
        versions.drop(job.team_id, target)
        state.forget(job.job_id)
    except Exception as exc:  # noqa: BLE001 (the job's own error is the one to raise)
        logger.warning("reindex job %s: could not drop v%s: %s", job.job_id, target, exc)
        return
    job.error = (
        f"{job.error}; its target v{target} was dropped (this failure cannot be resumed: "
        "a new run or --resume rebuilds it from scratch)"
    )


@dataclass
class CleanUp:
    """What ``clean_up`` did: superseded job ids, dropped versions, and the jobs it left
    alone with why."""

    team_id: str
    live_version: int | None
    superseded: list[str] = field(default_factory=list)
    dropped_versions: list[int] = field(default_factory=list)
    left_alone: list[dict[str, str]] = field(default_factory=list)


def clean_up(
    state: ReindexState,
    versions: CollectionVersions,
    team_id: str,
    stale_after_s: float,
    now: datetime | None = None,
) -> CleanUp:
    """Supersede the team's unfinished jobs whose driver is dead and drop their targets."""
    now = now or datetime.now(UTC)
    live = versions.current(team_id)
    report = CleanUp(team_id=team_id, live_version=live)
    for job in state.unfinished(team_id):
        if is_alive(job, stale_after_s, now):
            why = f"{job.status.value} and alive (a heartbeat within {stale_after_s:g}s)"
            report.left_alone.append({"job_id": job.job_id, "why": why})
            continue
        if job.status is JobStatus.SWITCHING:
            why = "was switching its alias: finish it with --resume"
            report.left_alone.append({"job_id": job.job_id, "why": why})
            continue
        dropped = retire(state, versions, job, f"cleaned up (--clean-up of {team_id!r})")
        report.superseded.append(job.job_id)
        if dropped is not None:
            report.dropped_versions.append(dropped)
    if not report.left_alone and live is not None:
        # Versions above the live one that no job owns any more (a drop that failed). Not
        # without a live version: a team's first ingestion creates v1 before its alias.
        for version in versions.existing(team_id):
            if version > live and versions.drop(team_id, version):
                report.dropped_versions.append(version)
    logger.info(
        "reindex clean-up of %s: superseded %s, dropped %s, left alone %s",
        team_id,
        report.superseded or "nothing",
        report.dropped_versions or "nothing",
        [j["job_id"] for j in report.left_alone] or "nothing",
    )
    return report
