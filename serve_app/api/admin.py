"""Operator endpoints: start a tenant reindex and follow it.

    POST /admin/reindex {"team_id": "dao_x"}  → 202 {"job_id": ..., "status": "queued", ...}
    GET  /admin/reindex/{job_id}              → the job: status, progress, counts, error

Only callers with the permission ``reindex.admin_permission`` (``admin:reindex``, every team)
or one of ``reindex.admin_roles`` (``owner``) in the job's team may call them; every decision
is audited (actions ``admin.reindex`` and ``admin.reindex.status``).

The job runs ``batch_ingest.reindex.run_job`` — on the Serve cluster as a Ray task (the ingress
replica is a Ray worker; the task drives the Ray Data job on the same cluster, and its actors
take fractional CPUs beside the Serve replicas), else as a subprocess of the CLI
(``python -m batch_ingest.reindex --job-id``). Either way the job row in the state database
(``state.url``) is the record: any ingress replica answers the GET, and a job survives the
replica that started it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from batch_ingest.reindex import SETTINGS_ENV, run_job
from batch_ingest.reindex_state import ACTIVE, JobStatus, ReindexJob, ReindexState
from deployments.errors import BackendUnavailable, Conflict, Forbidden, NotFound
from serve_app.access import OperatorRight, operator_scope
from serve_app.api.deps import Caller, Service
from serve_app.auth import Principal
from serve_app.service import GatewayService
from serve_app.settings import GatewaySettings

logger = logging.getLogger(__name__)
router = APIRouter(tags=["ops"])
ROOT = Path(__file__).resolve().parents[2]
# An active job whose row was not updated for this long no longer blocks a new one.
STALE_AFTER_S = 120.0


class ReindexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    team_id: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[^\x00-\x1f]+$",
        validation_alias=AliasChoices("team_id", "dao_id", "microdao_id"),
    )


def reindex_scope(service: GatewayService, principal: Principal, team_id: str) -> str:
    """Why ``principal`` may reindex ``team_id`` (``access.operator_scope``)."""
    cfg = service.settings.reindex
    right = OperatorRight(
        action="reindexing this team",
        subject="reindex",
        permission=cfg.admin_permission,
        roles=tuple(cfg.admin_roles),
        denied="reindex_not_granted",
        by_permission="permission_admin_reindex",
        by_role="team_admin_role",
    )
    production = service.settings.environment == "production"
    return operator_scope(principal, team_id, right, production=production)


class ReindexJobs:
    """Creates job rows and starts their runner; reads them back."""

    def __init__(self, settings: GatewaySettings, state: ReindexState | None = None) -> None:
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
        overrides = {
            name: getattr(s, name).model_dump()
            for name in ("embedder", "milvus", "chunking", "state", "reindex")
        }
        if runner == "ray":
            import ray

            # The task only drives the Ray Data job; the embedding actors ask for CPUs.
            task = ray.remote(run_job).options(num_cpus=0, max_retries=0, name="reindex")
            return task.remote(job.job_id, job.team_id, overrides)
        log_dir = ROOT / "var" / "reindex"
        log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "batch_ingest.reindex", "--team", job.team_id]
        cmd += ["--job-id", job.job_id]
        env = {**os.environ, SETTINGS_ENV: json.dumps(overrides)}
        with open(log_dir / f"{job.job_id}.log", "ab") as log:
            return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

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


def _jobs(request: Request, service: GatewayService) -> ReindexJobs:
    jobs = getattr(request.app.state, "reindex_jobs", None)
    if jobs is None:
        jobs = request.app.state.reindex_jobs = ReindexJobs(service.settings)
    return jobs


@router.post("/admin/reindex", status_code=202)
async def start_reindex(
    body: ReindexRequest,
    request: Request,
    caller: Caller,
    service: Service,
) -> dict[str, Any]:
    """Start re-embedding ``team_id`` into a new collection version (swapped in when done)."""
    principal, trace_id = caller.principal, caller.trace_id
    fields = {"action": "admin.reindex", "team_id": body.team_id, "path": request.url.path}
    with service.recorder.audited(caller, fields) as allowed:
        allowed.reason = reindex_scope(service, principal, body.team_id)
        job = await asyncio.to_thread(
            _jobs(request, service).submit, body.team_id, principal.sub or "dev"
        )
        allowed.http_status, allowed.fields = 202, {"resource": f"reindex:{job.job_id}"}
    return {**job.public(), "trace_id": trace_id}


@router.get("/admin/reindex/{job_id}")
async def reindex_status(
    job_id: str,
    request: Request,
    caller: Caller,
    service: Service,
) -> dict[str, Any]:
    """A reindex job: status, progress (done/total documents, rate, ETA), counts, error."""
    principal, trace_id = caller.principal, caller.trace_id
    fields = {"action": "admin.reindex.status", "path": request.url.path[:256]}
    with service.recorder.audited(caller, fields) as allowed:
        job = await asyncio.to_thread(_jobs(request, service).get, job_id[:64])
        if job is None:
            # Same answer whoever asks: a missing job says nothing about other teams.
            if not principal.trusts_body and (
                service.settings.reindex.admin_permission not in principal.permissions
            ):
                raise Forbidden("this reindex job is not visible", reason="reindex_not_granted")
            raise NotFound(f"no reindex job {job_id!r}")
        fields["team_id"] = job.team_id
        allowed.reason = reindex_scope(service, principal, job.team_id)
        allowed.fields = {"resource": f"reindex:{job.job_id}"}
    return {**job.public(), "trace_id": trace_id}
