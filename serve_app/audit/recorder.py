"""The one audit recorder: every allow/deny decision of a request, with the identity of the
verified caller, goes through it into the audit log (serve_app/audit/log.py)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from batch_ingest.audit_store import AuditRecord
from deployments.errors import Forbidden, GatewayError
from serve_app.audit.log import AuditLog
from serve_app.auth.principal import Principal
from serve_app.metrics import record_denial
from serve_app.request import RequestContext
from serve_app.timing import stage

logger = logging.getLogger(__name__)


@dataclass
class Allowed:
    """What an allowed request's audit record says (``AuditRecorder.audited``)."""

    reason: str = "granted"
    http_status: int = 200
    fields: dict[str, Any] = field(default_factory=dict)


class AuditRecorder:
    """Writes the decisions of requests to ``log``; never fails a request."""

    def __init__(self, log: AuditLog) -> None:
        self.log = log

    @contextlib.contextmanager
    def audited(self, rc: RequestContext, fields: dict[str, Any]) -> Iterator[Allowed]:
        """Audit the request run inside the block: a ``GatewayError`` raised there is
        audited (``error``) and re-raised; otherwise one allow record is written with
        ``fields`` (read at the end, so the block may add to it) and what the block set on
        the yielded ``Allowed`` (reason, status, extra fields such as the returned ids)."""
        trace_id, principal, started = rc.trace_id, rc.principal, rc.started
        allowed = Allowed()
        try:
            yield allowed
        except GatewayError as exc:
            self.error(exc, trace_id, principal, started, **fields)
            raise
        self.decision(
            trace_id,
            principal,
            started,
            decision="allow",
            reason=allowed.reason,
            http_status=allowed.http_status,
            **fields,
            **allowed.fields,
        )

    def decision(
        self,
        trace_id: str,
        principal: Principal | None,
        started: float | None = None,
        **fields: Any,
    ) -> None:
        """Queue one audit record; the identity fields come from the verified ``principal``
        (the body's ``user_id`` only for a dev-mode caller, which has no subject of its own)."""
        if principal is not None:
            fields.setdefault("auth_method", principal.method)
            fields.setdefault("key_id", principal.key_id)
            fields.setdefault("agent_id", principal.agent_id)
            fields.setdefault("subject", principal.sub)
            if principal.groups:
                fields.setdefault("groups", sorted(principal.groups))
        if started is not None:
            fields.setdefault("latency_ms", round((time.perf_counter() - started) * 1000, 2))
        try:
            with stage("audit"):
                self.log.record(AuditRecord(trace_id=trace_id, **fields))
        except Exception:  # the audit log must never fail a request
            logger.exception("audit record could not be queued")

    def error(
        self,
        exc: GatewayError,
        trace_id: str,
        principal: Principal | None,
        started: float | None = None,
        *,
        denied: bool | None = None,
        **fields: Any,
    ) -> None:
        """Audit a request that ended in ``exc``: a 401/403 is a deny with its reason; any
        other error came after access was granted (an allow answered with that status),
        unless ``denied`` says otherwise (an identity that could not be checked)."""
        if denied is None:
            denied = isinstance(exc, Forbidden) or exc.status_code == 401
        reason = exc.reason or exc.code
        if denied:
            record_denial(exc.status_code, reason)
        self.decision(
            trace_id,
            principal,
            started,
            decision="deny" if denied else "allow",
            reason=reason if denied else f"granted;{exc.code}",
            http_status=exc.status_code,
            **fields,
        )
