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

from fastapi import APIRouter, Request

from serve_app.http.deps import Caller
from serve_app.ops.contracts import ReindexJobResponse, ReindexRequest
from serve_app.ops.deps import Ops

router = APIRouter(tags=["ops"])


@router.post("/admin/reindex", status_code=202)
async def start_reindex(
    body: ReindexRequest, request: Request, caller: Caller, ops: Ops
) -> ReindexJobResponse:
    """Start re-embedding ``team_id`` into a new collection version (swapped in when done)."""
    return await ops.start_reindex(body, caller, request.url.path)


@router.get("/admin/reindex/{job_id}")
async def reindex_status(
    job_id: str, request: Request, caller: Caller, ops: Ops
) -> ReindexJobResponse:
    """A reindex job: status, progress (done/total documents, rate, ETA), counts, error."""
    return await ops.reindex_status(job_id, caller, request.url.path)
