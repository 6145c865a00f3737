"""The operator feature's service: the readiness of the backends, and the parts the operator
routes (audit log, embedding ledger, reindex jobs) work with."""

from __future__ import annotations

import asyncio
from typing import Any

from batch_ingest.pipeline import IngestPipeline
from batch_ingest.reindex.launcher import ReindexJobs
from deployments.protocols import Backends
from serve_app.audit.recorder import AuditRecorder
from serve_app.search.cache.semantic import SemanticCache
from serve_app.settings import GatewaySettings

# The longest /readyz waits for one component (a probe must answer before its own timeout).
READY_TIMEOUT_S = 3.0


class OpsService:
    """Readiness and the operator endpoints over the gateway's shared parts.

    Args:
        settings: the gateway's.
        backends: the backends /readyz asks.
        recorder: the audit recorder; its ``log`` is the audit log /audit/decisions reads.
        pipeline: the ingestion pipeline, whose ``usage`` is the embedding ledger.
        cache: the semantic cache (reported by /readyz, never blocking it), or None.
        reindex_jobs: the reindex launcher (default: one over ``settings``).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        backends: Backends,
        recorder: AuditRecorder,
        pipeline: IngestPipeline,
        cache: SemanticCache | None = None,
        reindex_jobs: ReindexJobs | None = None,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.recorder = recorder
        self.pipeline = pipeline
        self.cache = cache
        # Settable: tests put a fake launcher here.
        self.reindex_jobs = reindex_jobs if reindex_jobs is not None else ReindexJobs(settings)

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when the embedder has its model and Milvus and Neo4j answer. The audit
        database is reported too; it counts for readiness only with audit.required_for_ready."""
        backends, audit_log = self.backends, self.recorder.log
        parts: dict[str, Any] = {"embedder": backends.embedder, "milvus": backends.store}
        if backends.graph is not None:
            parts["neo4j"] = backends.graph
        if backends.reranker is not None:
            parts["reranker"] = backends.reranker

        async def one(name: str, backend: Any) -> tuple[str, dict[str, Any]]:
            try:
                return name, await asyncio.wait_for(backend.status(), timeout=READY_TIMEOUT_S)
            except Exception as exc:
                return name, {"ready": False, "error": f"{type(exc).__name__}: {exc}"}

        async def cache() -> tuple[str, dict[str, Any]]:
            assert self.cache is not None
            try:
                return "cache", await asyncio.wait_for(self.cache.status(), timeout=2)
            except Exception as exc:
                return "cache", {"ready": False, "error": f"{type(exc).__name__}: {exc}"}

        async def audit() -> tuple[str, dict[str, Any]]:
            try:
                return "audit", await asyncio.wait_for(
                    asyncio.to_thread(audit_log.status), timeout=READY_TIMEOUT_S
                )
            except Exception as exc:
                return "audit", {"ready": False, "error": f"{type(exc).__name__}: {exc}"}

        checks = [one(n, b) for n, b in parts.items()]
        if audit_log.enabled:
            checks.append(audit())
        if self.cache is not None:
            checks.append(cache())
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
