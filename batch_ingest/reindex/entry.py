"""The entry point of the Ray task that drives a job the admin API started, in a worker process
of its own (``max_calls=1``): a job that embeds lowers this process's CPU priority before it
imports Ray Data and starts its actor pool (``ReindexOptions.driver_nice``), so that it does
not take the cores from searches; the pool's actors lower theirs before their heavy imports
(``pool``). A job that copies vectors keeps its priority."""

from __future__ import annotations

from typing import Any


def run_low_priority_job(
    job_id: str, team_id: str, settings_overrides: dict[str, Any], nice: int
) -> dict:
    """``run_job``, its driver lowering its priority by ``nice`` once it starts an actor
    pool (only nice, no ``SCHED_IDLE``: it holds the write barrier during the switch)."""
    from batch_ingest.reindex.job import run_job

    return run_job(job_id, team_id, settings_overrides, driver_nice=nice)
