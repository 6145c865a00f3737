from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from serve_app.access.context import OperatorRight, operator_scope
from serve_app.auth import Principal
from serve_app.http.deps import Caller
from serve_app.http.errors import BackendUnavailable, InvalidInput
from serve_app.ops.deps import Ops
from serve_app.ops.service import OpsService

router = APIRouter(tags=["ops"])


def audit_scope(service: OpsService, principal: Principal, team_id: str | None) -> str:
    """Why ``principal`` may read the audit log for ``team_id`` (None = every team;
    ``access.operator_scope``)."""
    cfg = service.settings.audit
    right = OperatorRight(
        action="reading the audit log",
        subject="the audit log",
        permission=cfg.read_permission,
        roles=tuple(cfg.reader_roles),
        denied="audit_read_not_granted",
        by_permission="permission_audit_read",
        by_role="team_reader_role",
        where="in the team_id you query",
    )
    production = service.settings.environment == "production"
    return operator_scope(principal, team_id, right, production=production)


def utc(value: datetime | None, name: str) -> datetime | None:
    """``value`` as an aware UTC datetime (naive means UTC), so that any two compare.

    Raises:
        InvalidInput: the instant lies outside the years 1 to 9999 in UTC.
    """
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is in year 0 in UTC
        raise InvalidInput(f"{name} lies outside the years 1 to 9999 in UTC", field=name) from None


@router.get("/audit/decisions")
async def audit_decisions(
    request: Request,
    caller: Caller,
    service: Ops,
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
) -> dict[str, Any]:
    """Audited decisions, newest first. Needs the ``audit:read`` permission (every team), or
    a reader role (``audit.reader_roles``) in the ``team_id`` asked for. ``since`` after
    ``until`` is a 422 (a schema cannot compare two parameters)."""
    principal, trace_id = caller.principal, caller.trace_id
    fields = {"action": "audit.read", "team_id": team_id or "", "path": request.url.path}
    with service.recorder.audited(caller, fields) as allowed:
        allowed.reason = audit_scope(service, principal, team_id)
        allowed.fields = {"resource": f"audit:{team_id or '*'}"}
        cfg = service.settings.audit
        if limit > cfg.max_query_limit:
            raise InvalidInput(
                f"limit must be at most {cfg.max_query_limit}, got {limit}", field="limit"
            )
        since, until = utc(since, "since"), utc(until, "until")
        # since == until is an empty window, answered empty; since > until is a mistake.
        if since is not None and until is not None and since > until:
            raise InvalidInput("since must not be after until", field="since")
        if not service.recorder.log.enabled:
            raise BackendUnavailable("audit", "the audit log is disabled (AUDIT__ENABLED=false)")
        try:
            rows = await asyncio.to_thread(
                service.recorder.log.query, since, until, subject, decision, team_id, limit
            )
        except Exception as exc:
            raise BackendUnavailable(
                "audit",
                f"database unavailable: {type(exc).__name__}",
                hint="see /readyz (component audit)",
            ) from exc
    return {
        "decisions": [
            {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
            for row in rows
        ],
        "count": len(rows),
        "trace_id": trace_id,
    }
