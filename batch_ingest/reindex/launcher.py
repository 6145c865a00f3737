"""Jobs the admin API starts (``POST /admin/reindex``): ``ReindexJobs`` creates the job row
and starts its runner, then reads the row back.

The job runs ``batch_ingest.reindex.job.run_job`` — on a Ray cluster as a Ray task (an
ingress replica is a Ray worker; the task drives the Ray Data job on the same cluster, and its
actors take fractional CPUs beside the Serve replicas), else as a subprocess of the CLI
(``python -m batch_ingest.reindex --job-id ... --settings-stdin``), which reads the settings
sections from its standard input. Either way the job row in the state database is the record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batch_ingest.reindex.job import run_job
from batch_ingest.reindex.options import STALE_AFTER_S
from batch_ingest.reindex.state import ACTIVE, JobStatus, ReindexJob, ReindexState
from batch_ingest.settings import BatchSettings
from deployments.errors import BackendUnavailable, Conflict

ROOT = Path(__file__).resolve().parents[2]
# The settings sections a job takes from the process that starts it.
JOB_SECTIONS = ("embedder", "milvus", "chunking", "state", "reindex")


class ReindexJobs:
    """Creates job rows and starts their runner; reads them back."""

    def __init__(self, settings: BatchSettings, state: ReindexState | None = None) -> None:
        self.settings = settings
        self._state = state
        self._tasks: dict[str, Any] = {}  # job_id → Ray ObjectRef or Popen

    @property
    def state(self) -> ReindexState:
        if self._state is None:
            from batch_ingest.source_store import SourceStore

            self._state = ReindexState(SourceStore(self.settings.state.url).engine)
        return self._state

    def runner(self) -> str:
        choice = self.settings.reindex.runner
        if choice != "auto":
            return choice
        try:
            import ray

            return "ray" if ray.is_initialized() else "subprocess"
        except ImportError:
            return "subprocess"

    def submit(self, team_id: str, submitted_by: str) -> ReindexJob:
        now = datetime.now(UTC)
        for job in self.state.unfinished(team_id):
            fresh = job.updated_at and (now - job.updated_at).total_seconds() < STALE_AFTER_S
            if job.status in ACTIVE and fresh:
                raise Conflict(
                    f"reindex job {job.job_id} of this team is {job.status}",
                    hint=f"follow it at GET /admin/reindex/{job.job_id}",
                )
        runner = self.runner()
        job = self.state.create(team_id, {"runner": runner, "submitted_by": submitted_by})
        try:
            self._tasks[job.job_id] = self._start(runner, job)
        except Exception as exc:
            job.move_to(JobStatus.FAILED, f"could not start: {type(exc).__name__}: {exc}")
            job.finished_at = datetime.now(UTC)
            self.state.save(job)
            raise BackendUnavailable("reindex", f"the job could not be started: {exc}") from exc
        return job

    def _start(self, runner: str, job: ReindexJob) -> Any:
        s = self.settings
        overrides = {name: getattr(s, name).model_dump() for name in JOB_SECTIONS}
        if runner == "ray":
            import ray

            # The task only drives the Ray Data job; the embedding actors ask for CPUs.
            task = ray.remote(run_job).options(num_cpus=0, max_retries=0, name="reindex")
            return task.remote(job.job_id, job.team_id, overrides)
        log_dir = ROOT / "var" / "reindex"
        log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "batch_ingest.reindex", "--team", job.team_id]
        cmd += ["--job-id", job.job_id, "--settings-stdin"]
        with open(log_dir / f"{job.job_id}.log", "ab") as log:
            process = subprocess.Popen(
                cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT
            )
        assert process.stdin is not None  # stdin=PIPE
        with process.stdin:
            process.stdin.write(json.dumps(overrides).encode())
        return process

    def get(self, job_id: str) -> ReindexJob | None:
        job = self.state.get(job_id)
        if job is None or job.status not in ACTIVE:
            return job
        # A runner that died before it could record its failure.
        task = self._tasks.get(job_id)
        error = None
        if isinstance(task, subprocess.Popen) and task.poll() not in (None, 0):
            error = f"the reindex process exited with status {task.returncode}"
        elif task is not None and not isinstance(task, subprocess.Popen):
            import ray

            ready, _ = ray.wait([task], timeout=0)
            if ready:
                try:
                    ray.get(ready[0])
                except Exception as exc:
                    error = f"the reindex task failed: {type(exc).__name__}: {exc}"
        if error:
            job = self.state.get(job_id) or job
            if job.status in ACTIVE:
                job.error = job.error or error
        return job
