"""The entry point of the Ray task that drives a job the admin API started: it lowers its CPU
priority before it imports anything heavy (the package's ``__init__`` imports nothing
either), so that a job starting beside the Serve replicas does not take the cores from
searches. The pool's actors do the same (``pool``)."""

from __future__ import annotations

from typing import Any

from batch_ingest.reindex.priority import lower_priority


def run_low_priority_job(
    job_id: str, team_id: str, settings_overrides: dict[str, Any], nice: int
) -> dict:
    """``run_job`` at ``nice`` more than the process had (the Ray task's entry point). Only
    nice: the driver holds the write barrier during the switch and must not be starved."""
    lower_priority(nice)
    from batch_ingest.reindex.job import run_job

    return run_job(job_id, team_id, settings_overrides)
