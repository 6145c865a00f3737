"""The operator feature's service: the readiness of the backends, the audit log
(/audit/decisions), the embedding ledger (/admin/usage) and tenant reindexing
(/admin/reindex). Each operator call is audited; who may make it is an ``OperatorRight``
(``access.operator_scope``) whose permission and roles come from the settings."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, date, datetime
from typing import Any

from batch_ingest.pipeline import IngestPipeline
from batch_ingest.reindex.launcher import ReindexJobs
from deployments.errors import BackendUnavailable, Forbidden, InvalidInput, NotFound
from deployments.protocols import Backends
from serve_app.access.context import OperatorRight, operator_scope
from serve_app.audit.log import jsonable
from serve_app.audit.recorder import AuditRecorder
from serve_app.auth import Principal
from serve_app.ops.contracts import (
    AuditDecisionsResponse,
    EmbeddingUsageResponse,
    ReindexJobResponse,
    ReindexRequest,
)
from serve_app.request import RequestContext
from serve_app.search.cache.semantic import SemanticCache
from serve_app.settings import GatewaySettings

# The longest /readyz waits for one component (a probe must answer before its own timeout),
# and for the semantic cache, which never blocks readiness.
READY_TIMEOUT_S = 3.0
CACHE_READY_TIMEOUT_S = 2.0

# The two operator rights, less the permission and roles that grant them (the settings'
# at call time): reading the audit log (and the embedding ledger), and reindexing a team.
AUDIT_READ = OperatorRight(
    action="reading the audit log",
    subject="the audit log",
    permission="",
    roles=(),
    denied="audit_read_not_granted",
    by_permission="permission_audit_read",
    by_role="team_reader_role",
    where="in the team_id you query",
)
REINDEX = OperatorRight(
    action="reindexing this team",
    subject="reindex",
    permission="",
    roles=(),
    denied="reindex_not_granted",
    by_permission="permission_admin_reindex",
    by_role="team_admin_role",
)


async def probe(
    name: str,
    status: Callable[[], Awaitable[dict[str, Any]]],
    timeout_s: float = READY_TIMEOUT_S,
) -> tuple[str, dict[str, Any]]:
    """``name`` and what ``status()`` answers within ``timeout_s``; not ready, with the
    error, when it fails or is late."""
    try:
        return name, await asyncio.wait_for(status(), timeout=timeout_s)
    except Exception as exc:
        return name, {"ready": False, "error": f"{type(exc).__name__}: {exc}"}


def check_window(since: date | None, until: date | None) -> None:
    """A window of time (or days) from ``since`` to ``until``, either open.

    Raises:
        InvalidInput: ``since`` is after ``until`` (the same instant is an empty window).
    """
    if since is not None and until is not None and since > until:
        raise InvalidInput("since must not be after until", field="since")


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


class OpsService:
    """Readiness and the operator endpoints over the gateway's shared parts.

    Args:
        settings: the gateway's.
        backends: the backends /readyz asks.
        recorder: the audit recorder; its ``log`` is the audit log /audit/decisions reads.
        pipeline: the ingestion pipeline, whose ``usage`` is the embedding ledger.
        reindex_jobs: the reindex launcher.
        cache: the semantic cache (reported by /readyz, never blocking it), or None.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        backends: Backends,
        recorder: AuditRecorder,
        pipeline: IngestPipeline,
        reindex_jobs: ReindexJobs,
        cache: SemanticCache | None = None,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.recorder = recorder
        self.pipeline = pipeline
        self.cache = cache
        # Settable: tests put a fake launcher here.
        self.reindex_jobs = reindex_jobs

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when the embedder has its model and Milvus and Neo4j answer. The audit
        database is reported too; it counts for readiness only with audit.required_for_ready."""
        backends, audit_log = self.backends, self.recorder.log
        parts: dict[str, Any] = {"embedder": backends.embedder, "milvus": backends.store}
        if backends.graph is not None:
            parts["neo4j"] = backends.graph
        if backends.reranker is not None:
            parts["reranker"] = backends.reranker

        checks = [probe(n, b.status, READY_TIMEOUT_S) for n, b in parts.items()]
        if audit_log.enabled:
            checks.append(probe("audit", lambda: asyncio.to_thread(audit_log.status)))
        if self.cache is not None:
            checks.append(probe("cache", self.cache.status, CACHE_READY_TIMEOUT_S))
        results = dict(await asyncio.gather(*checks))
        # The cache never blocks readiness: without it searches run uncached.
        optional = {"cache"} if self.settings.audit.required_for_ready else {"audit", "cache"}
        not_ready = [n for n, s in results.items() if not s.get("ready") and n not in optional]
        body: dict[str, Any] = {
            "ready": not not_ready,
            "not_ready": not_ready,
            "components": results,
        }
        degraded = [n for n in optional if n in results and not results[n].get("ready")]
        if degraded:
            body["degraded"] = degraded
        return not not_ready, body

    # --- who may ---------------------------------------------------------------------------
    def audit_scope(self, principal: Principal, team_id: str | None) -> str:
        """Why ``principal`` may read the audit log (and the embedding ledger) of ``team_id``
        (None = every team)."""
        cfg = self.settings.audit
        return self._scope(AUDIT_READ, cfg.read_permission, cfg.reader_roles, principal, team_id)

    def reindex_scope(self, principal: Principal, team_id: str) -> str:
        """Why ``principal`` may reindex ``team_id``."""
        cfg = self.settings.reindex
        return self._scope(REINDEX, cfg.admin_permission, cfg.admin_roles, principal, team_id)

    def _scope(
        self,
        right: OperatorRight,
        permission: str,
        roles: list[str],
        principal: Principal,
        team_id: str | None,
    ) -> str:
        """``right`` granted by ``permission`` or one of ``roles`` (the settings' now):
        ``access.operator_scope``, which raises Forbidden when neither applies."""
        granted = replace(right, permission=permission, roles=tuple(roles))
        production = self.settings.environment == "production"
        return operator_scope(principal, team_id, granted, production=production)

    # --- GET /audit/decisions --------------------------------------------------------------
    async def audit_decisions(
        self,
        rc: RequestContext,
        path: str,
        *,
        since: datetime | None,
        until: datetime | None,
        subject: str | None,
        decision: str | None,
        team_id: str | None,
        limit: int,
    ) -> AuditDecisionsResponse:
        """Audited decisions matching the filters, newest first (``since <= ts < until``).

        Raises:
            Forbidden: the caller may not read the audit log of ``team_id``.
            InvalidInput: ``limit`` above ``audit.max_query_limit``, ``since`` after ``until``
                or an instant outside the years 1 to 9999 in UTC.
            BackendUnavailable: the audit log is disabled or its database does not answer.
        """
        fields = {"action": "audit.read", "team_id": team_id or "", "path": path}
        with self.recorder.audited(rc, fields) as allowed:
            allowed.reason = self.audit_scope(rc.principal, team_id)
            allowed.fields = {"resource": f"audit:{team_id or '*'}"}
            cfg = self.settings.audit
            if limit > cfg.max_query_limit:
                raise InvalidInput(
                    f"limit must be at most {cfg.max_query_limit}, got {limit}", field="limit"
                )
            since, until = utc(since, "since"), utc(until, "until")
            check_window(since, until)
            log = self.recorder.log
            if not log.enabled:
                raise BackendUnavailable(
                    "audit", "the audit log is disabled (AUDIT__ENABLED=false)"
                )
            try:
                rows = await asyncio.to_thread(
                    log.query, since, until, subject, decision, team_id, limit
                )
            except Exception as exc:
                raise BackendUnavailable(
                    "audit",
                    f"database unavailable: {type(exc).__name__}",
                    hint="see /readyz (component audit)",
                ) from exc
        return AuditDecisionsResponse.model_validate(
            {
                "decisions": [jsonable(row) for row in rows],
                "count": len(rows),
                "trace_id": rc.trace_id,
            }
        )

    # --- GET /admin/usage ------------------------------------------------------------------
    async def embedding_usage(
        self,
        rc: RequestContext,
        path: str,
        *,
        team_id: str | None,
        since: date | None,
        until: date | None,
    ) -> EmbeddingUsageResponse:
        """Embedded tokens and chunks per team, source and day, with totals per team.

        Raises:
            Forbidden: the caller may not read the audit log of ``team_id``.
            InvalidInput: ``since`` after ``until``.
            BackendUnavailable: no state database, or it does not answer.
        """
        fields = {"action": "usage.read", "team_id": team_id or "", "path": path}
        with self.recorder.audited(rc, fields) as allowed:
            allowed.reason = self.audit_scope(rc.principal, team_id)
            allowed.fields = {"resource": f"usage:{team_id or '*'}"}
            check_window(since, until)
            usage = self.pipeline.usage
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
        return EmbeddingUsageResponse.model_validate(
            {"usage": [vars(row) for row in rows], "totals": totals, "trace_id": rc.trace_id}
        )

    # --- POST /admin/reindex, GET /admin/reindex/{job_id} -----------------------------------
    async def start_reindex(
        self, body: ReindexRequest, rc: RequestContext, path: str
    ) -> ReindexJobResponse:
        """Submit a reindex job of ``body.team_id`` (202; audited as ``admin.reindex``).

        Raises:
            Forbidden: the caller may not reindex the team.
            NotFound: an unknown team without ``allow_empty`` (``unknown_team``).
        """
        principal = rc.principal
        fields = {"action": "admin.reindex", "team_id": body.team_id, "path": path}
        with self.recorder.audited(rc, fields) as allowed:
            allowed.reason = self.reindex_scope(principal, body.team_id)
            job = await asyncio.to_thread(
                self.reindex_jobs.submit,
                body.team_id,
                principal.sub or "dev",
                allow_empty=body.allow_empty,
            )
            allowed.http_status, allowed.fields = 202, {"resource": f"reindex:{job.job_id}"}
        return ReindexJobResponse.model_validate({**job.public(), "trace_id": rc.trace_id})

    async def reindex_status(
        self, job_id: str, rc: RequestContext, path: str
    ) -> ReindexJobResponse:
        """A reindex job (audited as ``admin.reindex.status``).

        Raises:
            Forbidden: the caller may not reindex the job's team, or (for a missing job)
                holds no permission to reindex every team.
            NotFound: no such job, asked by a caller with that permission.
        """
        principal = rc.principal
        fields = {"action": "admin.reindex.status", "path": path[:256]}
        with self.recorder.audited(rc, fields) as allowed:
            job = await asyncio.to_thread(self.reindex_jobs.get, job_id[:64])
            if job is None:
                # Same answer whoever asks: a missing job says nothing about other teams.
                if not principal.trusts_body and (
                    self.settings.reindex.admin_permission not in principal.permissions
                ):
                    raise Forbidden("this reindex job is not visible", reason="reindex_not_granted")
                raise NotFound(f"no reindex job {job_id!r}")
            fields["team_id"] = job.team_id
            allowed.reason = self.reindex_scope(principal, job.team_id)
            allowed.fields = {"resource": f"reindex:{job.job_id}"}
        return ReindexJobResponse.model_validate({**job.public(), "trace_id": rc.trace_id})
