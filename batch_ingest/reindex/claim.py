"""Which job row a reindex run works on, and what happens to the team's older ones."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from batch_ingest.reindex.options import STALE_AFTER_S, ReindexError, ReindexOptions
from batch_ingest.reindex.state import JobStatus, ReindexJob, ReindexState
from deployments.milvus_versions import CollectionVersions


def claim_job(
    state: ReindexState, versions: CollectionVersions, options: ReindexOptions
) -> ReindexJob:
    """The job row this run works on: ``options.job_id``'s, the team's unfinished one
    (``resume``) or a new one. Older unfinished jobs of the team are superseded and their
    half-built versions dropped; one that is still active, or was switching its alias, stops
    the run with a ``ReindexError`` instead."""
    team = options.team_id
    unfinished = state.unfinished(team)
    if options.job_id:
        job = state.get(options.job_id)
        if job is None or job.team_id != team:
            raise ReindexError(f"no reindex job {options.job_id} for team {team!r}")
        others = [j for j in unfinished if j.job_id != job.job_id]
    elif options.resume:
        if not unfinished:
            raise ReindexError(f"team {team!r} has no unfinished reindex job to resume")
        job, others = unfinished[0], unfinished[1:]
    else:
        job, others = None, unfinished
    now = datetime.now(UTC)
    for old in others:
        # An abandoned attempt: its half-built version is not live; drop it.
        age = (now - old.updated_at).total_seconds() if old.updated_at else math.inf
        if old.status in (JobStatus.QUEUED, JobStatus.RUNNING) and age < STALE_AFTER_S:
            raise ReindexError(
                f"job {old.job_id} of team {team!r} is {old.status} (updated {age:.0f}s "
                "ago); wait for it, or resume it once it has stopped"
            )
        if old.status == JobStatus.SWITCHING:
            raise ReindexError(
                f"job {old.job_id} of team {team!r} was switching its alias; "
                "resume it (--resume) before starting another"
            )
        old.move_to(JobStatus.SUPERSEDED, f"superseded by a newer job of {team!r}")
        old.finished_at = datetime.now(UTC)
        state.save(old)
        if old.target_version is not None and old.target_version != (versions.current(team)):
            versions.drop(team, old.target_version)
        state.forget(old.job_id)
    if job is None:
        job = state.create(team, {"actors": options.actors, "engine": options.engine})
    return job
