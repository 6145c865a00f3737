"""Operator endpoints: start a tenant reindex and follow it.

    POST /admin/reindex {"team_id": "dao_x"}  → 202 {"job_id": ..., "status": "queued", ...}
    GET  /admin/reindex/{job_id}              → the job: status, progress, counts, error

A team with no documents and no collection (a typo) is 404 ``unknown_team`` and no job is
created, unless the body says ``"allow_empty": true``. A job whose driver stopped beating
reads as ``stalled`` (with a note saying since when and how to continue); one whose runner
crashed reads as ``failed``.

Only callers with the permission ``reindex.admin_permission`` (``admin:reindex``, every team)
or one of ``reindex.admin_roles`` (``owner``) in the job's team may call them; every decision
is audited (actions ``admin.reindex`` and ``admin.reindex.status``).

``batch_ingest.reindex.launcher.ReindexJobs`` creates the job row and starts its runner (a Ray
task on the Serve cluster, else a subprocess); the row in the state database (``state.url``)
is the record: any ingress replica answers the GET, and a job survives the replica that
started it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, Request
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from deployments.errors import Forbidden, NotFound
from serve_app.access.context import OperatorRight, operator_scope
from serve_app.auth import Principal
from serve_app.http.deps import Caller
from serve_app.ops.deps import Ops
from serve_app.ops.service import OpsService

logger = logging.getLogger(__name__)
router = APIRouter(tags=["ops"])


class ReindexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    team_id: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[^\x00-\x1f]+$",
        validation_alias=AliasChoices("team_id", "dao_id", "microdao_id"),
    )
    # Build a team with no documents and no collection on purpose (else 404 unknown_team).
    allow_empty: bool = False


def reindex_scope(service: OpsService, principal: Principal, team_id: str) -> str:
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


@router.post("/admin/reindex", status_code=202)
async def start_reindex(
    body: ReindexRequest,
    request: Request,
    caller: Caller,
    service: Ops,
) -> dict[str, Any]:
    """Start re-embedding ``team_id`` into a new collection version (swapped in when done)."""
    principal, trace_id = caller.principal, caller.trace_id
    fields = {"action": "admin.reindex", "team_id": body.team_id, "path": request.url.path}
    with service.recorder.audited(caller, fields) as allowed:
        allowed.reason = reindex_scope(service, principal, body.team_id)
        job = await asyncio.to_thread(
            service.reindex_jobs.submit,
            body.team_id,
            principal.sub or "dev",
            allow_empty=body.allow_empty,
        )
        allowed.http_status, allowed.fields = 202, {"resource": f"reindex:{job.job_id}"}
    return {**job.public(), "trace_id": trace_id}


@router.get("/admin/reindex/{job_id}")
async def reindex_status(
    job_id: str,
    request: Request,
    caller: Caller,
    service: Ops,
) -> dict[str, Any]:
    """A reindex job: status, progress (done/total documents, rate, ETA), counts, error."""
    principal, trace_id = caller.principal, caller.trace_id
    fields = {"action": "admin.reindex.status", "path": request.url.path[:256]}
    with service.recorder.audited(caller, fields) as allowed:
        job = await asyncio.to_thread(service.reindex_jobs.get, job_id[:64])
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
