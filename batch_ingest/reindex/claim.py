"""Which job row a reindex run works on, and what happens to the team's older ones."""

from __future__ import annotations

from datetime import UTC, datetime

from batch_ingest.reindex.cleanup import retire
from batch_ingest.reindex.liveness import is_alive, silent_for
from batch_ingest.reindex.options import ReindexError, ReindexOptions
from batch_ingest.reindex.state import JobStatus, ReindexJob, ReindexState
from deployments.vector_store.versions import CollectionVersions


def claim_job(
    state: ReindexState, versions: CollectionVersions, options: ReindexOptions
) -> ReindexJob:
    """The job row this run works on: ``options.job_id``'s, the team's unfinished one
    (``resume``) or a new one, with its heartbeat taken (so a second driver is refused).
    Older unfinished jobs of the team are superseded and their half-built versions dropped;
    one that is still alive, or was switching its alias, stops the run with a
    ``ReindexError`` instead. So does a job to run whose driver is alive."""
    team = options.team_id
    bound = options.stale_after_s
    now = datetime.now(UTC)
    unfinished = state.unfinished(team)
    if options.job_id:
        job = state.get(options.job_id)
        if job is None or job.team_id != team:
            raise ReindexError(f"no reindex job {options.job_id} for team {team!r}")
        if job.finished:
            raise ReindexError(f"reindex job {job.job_id} is {job.status}: nothing to run")
        others = [j for j in unfinished if j.job_id != job.job_id]
    elif options.resume:
        if not unfinished:
            raise ReindexError(f"team {team!r} has no unfinished reindex job to resume")
        job, others = unfinished[0], unfinished[1:]
    else:
        job, others = None, unfinished
    # A queued job nobody has started yet (no heartbeat) is the runner's to take; the
    # compare-and-set of its heartbeat below lets only one driver have it.
    unstarted = job is not None and job.status is JobStatus.QUEUED and job.heartbeat_at is None
    if job is not None and not unstarted and is_alive(job, bound, now):
        raise ReindexError(
            f"reindex job {job.job_id} of team {team!r} is {job.status} and its driver is "
            f"alive (last heartbeat {silent_for(job, now):.0f}s ago): a second driver would "
            f"write the same target. Wait for it, or stop its process: it can be resumed once "
            f"it has had no heartbeat for {bound:g}s"
        )
    for old in others:
        if is_alive(old, bound, now):
            raise ReindexError(
                f"job {old.job_id} of team {team!r} is {old.status} and alive (last sign of "
                f"life {silent_for(old, now):.0f}s ago); wait for it, or resume it once it has "
                "stopped"
            )
        if old.status == JobStatus.SWITCHING:
            raise ReindexError(
                f"job {old.job_id} of team {team!r} was switching its alias; "
                "resume it (--resume) before starting another"
            )
        retire(state, versions, old, f"superseded by a newer job of {team!r}")
    if job is None:
        job = state.create(
            team,
            {
                "actors": options.actors,
                "engine": options.engine,
                "allow_empty": options.allow_empty,
            },
        )
    taken = state.beat(job.job_id, job.heartbeat_at)
    if taken is None:
        raise ReindexError(f"reindex job {job.job_id} of team {team!r} was taken by another driver")
    job.heartbeat_at = taken
    return job
