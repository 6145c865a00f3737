"""GET /audit/decisions: the audited decisions, newest first (serve_app/ops/service.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from serve_app.http.deps import Caller
from serve_app.ops.contracts import AuditDecisionsResponse
from serve_app.ops.deps import Ops

router = APIRouter(tags=["ops"])


@router.get("/audit/decisions")
async def audit_decisions(
    request: Request,
    caller: Caller,
    ops: Ops,
    since: Annotated[
        datetime | None,
        Query(description="ISO 8601 (naive = UTC); ts >= since. Not after `until` (422)."),
    ] = None,
    until: Annotated[
        datetime | None, Query(description="ISO 8601 (naive = UTC); ts < until")
    ] = None,
    subject: Annotated[str | None, Query(max_length=256)] = None,
    decision: Annotated[Literal["allow", "deny"] | None, Query()] = None,
    team_id: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[
        int, Query(ge=1, description="at most audit.max_query_limit (1000 by default)")
    ] = 100,
) -> AuditDecisionsResponse:
    """Audited decisions, newest first. Needs the ``audit:read`` permission (every team), or
    a reader role (``audit.reader_roles``) in the ``team_id`` asked for. ``since`` after
    ``until`` is a 422 (a schema cannot compare two parameters)."""
    return await ops.audit_decisions(
        caller,
        request.url.path,
        since=since,
        until=until,
        subject=subject,
        decision=decision,
        team_id=team_id,
        limit=limit,
    )
