"""GET /admin/usage: the embedding ledger (batch_ingest/usage.py) — passage tokens and chunks
embedded per team, source (api, bus, reindex, bulk) and UTC day, whichever process embedded them.

Who may read it: the same right as the audit log (``audit.read_permission`` for every team,
or one of ``audit.reader_roles`` in the ``team_id`` asked for); audited as ``usage.read``."""

from __future__ import annotations

import asyncio
from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from serve_app.http.deps import Caller
from serve_app.http.errors import BackendUnavailable, InvalidInput
from serve_app.ops.audit import audit_scope
from serve_app.ops.deps import Ops

router = APIRouter(tags=["ops"])


@router.get("/admin/usage")
async def embedding_usage(
    request: Request,
    caller: Caller,
    service: Ops,
    team_id: Annotated[str | None, Query(max_length=256)] = None,
    since: Annotated[
        date | None, Query(description="first UTC day, YYYY-MM-DD; not after `until` (422)")
    ] = None,
    until: Annotated[date | None, Query(description="last UTC day, YYYY-MM-DD")] = None,
) -> dict[str, Any]:
    """Embedded tokens and chunks per team, source and day, with totals per team. ``since``
    after ``until`` is a 422 (a schema cannot compare two parameters)."""
    fields = {"action": "usage.read", "team_id": team_id or "", "path": request.url.path}
    with service.recorder.audited(caller, fields) as allowed:
        allowed.reason = audit_scope(service, caller.principal, team_id)
        allowed.fields = {"resource": f"usage:{team_id or '*'}"}
        if since is not None and until is not None and since > until:
            raise InvalidInput("since must not be after until", field="since")
        usage = service.pipeline.usage
        if usage is None:
            raise BackendUnavailable("state", "no state database, so no embedding ledger")
        try:
            rows = await asyncio.to_thread(
                usage.rows,
                team_id,
                since.isoformat() if since else None,
                until.isoformat() if until else None,
            )
        except Exception as exc:
            raise BackendUnavailable(
                "state", f"database unavailable: {type(exc).__name__}"
            ) from exc
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        total = totals.setdefault(row.team_id, {"tokens": 0, "chunks": 0})
        total["tokens"] += row.tokens
        total["chunks"] += row.chunks
    return {
        "usage": [vars(row) for row in rows],
        "totals": totals,
        "trace_id": caller.trace_id,
    }
