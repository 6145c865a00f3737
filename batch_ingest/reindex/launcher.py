"""Jobs the admin API starts (``POST /admin/reindex``): ``ReindexJobs`` creates the job row
and starts its runner, then reads the row back.

The job runs ``batch_ingest.reindex.job.run_job`` — on a Ray cluster as a Ray task (``entry``, an
ingress replica is a Ray worker; the task drives the Ray Data job on the same cluster, and its
actors take fractional CPUs beside the Serve replicas), else as a subprocess of the CLI
(``python -m batch_ingest.reindex --job-id ... --settings-stdin``), which reads the settings
sections from its standard input. Either way the job row in the state database is the record.

Reading a job back is honest about its driver: a runner this launcher started that died (the
Ray task raised, the process exited) before recording the end makes the job ``failed`` in
its row; an active job whose heartbeat is older than ``reindex.stale_after_s`` is shown as
``stalled`` (``batch_ingest.reindex.liveness``), whichever replica asks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batch_ingest.reindex.entry import run_low_priority_job
from batch_ingest.reindex.liveness import present
from batch_ingest.reindex.state import ACTIVE, JobStatus, ReindexJob, ReindexState
from batch_ingest.reindex.team import require_known_team
from batch_ingest.settings import BatchSettings
from batch_ingest.source_store import SourceStore
from deployments.errors import BackendUnavailable, Conflict
from deployments.vector_store.versions import CollectionVersions

ROOT = Path(__file__).resolve().parents[2]
# The settings sections a job takes from the process that starts it.
# ``embedder_next`` too: a job started during a change of model embeds with the next model
# the gateway was deployed with (``None``: no change under way, whatever the job's env says).
JOB_SECTIONS = ("embedder", "embedder_next", "milvus", "chunking", "state", "reindex")
# The longest error text of a crashed runner kept in the job row.
MAX_ERROR_CHARS = 2000


class ReindexJobs:
    """Creates job rows and starts their runner; reads them back.

    Args:
        settings: the gateway's (state database, Milvus, reindex options).
        state, sources: job rows and the source registry (default: ``settings.state.url``).
        versions: the team collections, asked whether an unknown team has one (default: a
            ``MilvusStore`` of ``settings.milvus``, opened on first need).
    """

    def __init__(
        self,
        settings: BatchSettings,
        state: ReindexState | None = None,
        *,
        sources: SourceStore | None = None,
        versions: CollectionVersions | None = None,
    ) -> None:
        self.settings = settings
        self._state = state
        self._sources = sources
        self._versions = versions
        self._tasks: dict[str, Any] = {}  # job_id → Ray ObjectRef or Popen

    @property
    def sources(self) -> SourceStore:
        if self._sources is None:
            self._sources = SourceStore(self.settings.state.url)
        return self._sources

    @property
    def state(self) -> ReindexState:
        if self._state is None:
            self._state = ReindexState(self.sources.engine)
        return self._state

    @property
    def versions(self) -> CollectionVersions:
        if self._versions is None:
            from deployments.models.embedding import embedding_dim
            from deployments.vector_store.store import MilvusStore

            s = self.settings
            store = MilvusStore(s.milvus, dim=embedding_dim(s.embedder), lexical=s.embedder.lexical)
            store.start()
            self._versions = store.versions
        return self._versions

    def runner(self) -> str:
        choice = self.settings.reindex.runner
        if choice != "auto":
            return choice
        try:
            import ray

            return "ray" if ray.is_initialized() else "subprocess"
        except ImportError:
            return "subprocess"

    def submit(self, team_id: str, submitted_by: str, allow_empty: bool = False) -> ReindexJob:
        """Create the team's job and start its runner.

        Raises:
            Conflict: a job of the team is alive (a stalled one does not count).
            UnknownTeam: the team has no documents and no collection (unless
                ``allow_empty``); no job row is created.
            BackendUnavailable: the runner could not be started (the row says failed).
        """
        for unfinished in self.state.unfinished(team_id):
            job = self.get(unfinished.job_id) or unfinished
            if job.status in ACTIVE:  # alive: a stalled job reads as "stalled"
                raise Conflict(
                    f"reindex job {job.job_id} of this team is {job.status}",
                    hint=f"follow it at GET /admin/reindex/{job.job_id}",
                )
        if not allow_empty:
            require_known_team(team_id, self.sources, lambda t: self.versions.current(t))
        runner = self.runner()
        options = {"runner": runner, "submitted_by": submitted_by, "allow_empty": allow_empty}
        job = self.state.create(team_id, options)
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
        overrides = {name: _dump(getattr(s, name)) for name in JOB_SECTIONS}
        if runner == "ray":
            import ray

            # The task only drives the Ray Data job; the embedding actors ask for CPUs. It runs
            # at a lower priority (reindex.nice), in a worker process of its own that exits
            # after it (max_calls=1): a lowered priority cannot be raised again, and Ray
            # would otherwise reuse the process, perhaps for a Serve replica.
            task = ray.remote(num_cpus=0, max_retries=0, max_calls=1)(run_low_priority_job).options(
                name="reindex"
            )
            return task.remote(job.job_id, job.team_id, overrides, s.reindex.nice)
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
        """The job as it stands: failed (and so recorded) if the runner this launcher started
        ended without recording it, ``stalled`` if its heartbeat is too old."""
        job = self.state.get(job_id)
        if job is None or job.status not in ACTIVE:
            return job
        error = self._runner_ended(job_id)
        if error is not None:
            # Read again after the runner ended: it may have recorded its end just before.
            job = self.state.get(job_id) or job
            if job.status in ACTIVE:
                job.move_to(JobStatus.FAILED, error[:MAX_ERROR_CHARS])
                job.eta_s = None
                job.finished_at = datetime.now(UTC)
                self.state.save(job)
            self._tasks.pop(job_id, None)
        return present(job, self.settings.reindex.stale_after_s)

    def _runner_ended(self, job_id: str) -> str | None:
        """Why the runner of ``job_id`` (if this launcher started it) is over, or ``None``
        while it runs (or is not ours)."""
        task = self._tasks.get(job_id)
        if task is None:
            return None
        if isinstance(task, subprocess.Popen):
            if task.poll() is None:
                return None
            return f"the reindex process exited with status {task.returncode}"
        import ray

        ready, _ = ray.wait([task], timeout=0)
        if not ready:
            return None
        try:
            ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 (any failure of the task is the job's)
            return f"the reindex task failed: {type(exc).__name__}: {exc}"
        return "the reindex task returned without finishing the job"


def _dump(section: Any) -> Any:
    """A settings section as plain data (``None`` stays ``None``)."""
    return None if section is None else section.model_dump()
