"""GatewayService: the gateway's services over the backend protocols — search, enrich,
ingestion and the graph tools, one each, sharing the policy, the audit recorder and the
retrieval pipeline — and the readiness of the backends.

The Serve ingress builds it with handle proxies (serve_app/composition.py); unit tests build
it with fakes. Routes stay thin: each calls one method of its feature's service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from batch_ingest.chunking import whitespace_tokens
from batch_ingest.pipeline import IngestPipeline
from deployments.protocols import (
    Embedder,
    GraphStore,
    Reranker,
    VectorStore,
)
from serve_app.access.policy import Policy
from serve_app.audit.log import AuditLog
from serve_app.audit.recorder import AuditRecorder
from serve_app.enrich.service import EnrichService
from serve_app.graph.service import GraphTools
from serve_app.http.rate_limits import RateLimiter
from serve_app.ingest.service import IngestService
from serve_app.profiles import ProfileSet
from serve_app.search.cache.semantic import SemanticCache
from serve_app.search.cache.store import build_store
from serve_app.search.retrieval import Retrieval
from serve_app.search.service import SearchService
from serve_app.settings import GatewaySettings

# The longest /readyz waits for one component (a probe must answer before its own timeout).
READY_TIMEOUT_S = 3.0


class GatewayService:
    def __init__(
        self,
        *,
        settings: GatewaySettings,
        embedder: Embedder,
        store: VectorStore,
        graph: GraphStore | None,
        reranker: Reranker | None,
        pipeline: IngestPipeline,
        count_tokens: Callable[[str], int] = whitespace_tokens,
        policy: Policy | None = None,
        audit: AuditLog | None = None,
        profiles: ProfileSet | None = None,
    ) -> None:
        self.settings = settings
        # Every allow/deny decision goes here (asynchronously; see serve_app/audit/log.py).
        self.recorder = AuditRecorder(audit if audit is not None else AuditLog(settings.audit))
        # Roles, doc types and resource policies; the file of auth.policy_file by default.
        self.policy = policy if policy is not None else Policy.load(settings.auth.policy_file)
        self.embedder = embedder
        self.store = store
        self.graph = graph
        self.reranker = reranker
        self.pipeline = pipeline
        # graph.query_context, graph.explain_path and the entity upsert.
        self.graph_tools = GraphTools(settings, graph, self.policy, self.recorder)
        self.graph_tools.on_write = self._graph_written
        # Per-agent RAG profiles, and the semantic cache of rag.search_docs (it needs the
        # state database's index generations, which the pipeline's registry provides).
        self.profiles = (
            profiles if profiles is not None else ProfileSet.load(settings.profiles.file)
        )
        # The search pipeline rag.search_docs and rag.enrich_answer share.
        self.retrieval = Retrieval(
            settings=settings,
            embedder=embedder,
            store=store,
            graph=graph,
            reranker=reranker,
            count_tokens=count_tokens,
        )
        self.cache = (
            SemanticCache(
                settings.cache,
                build_store(settings.cache),
                pipeline.generations,
                self.retrieval.query_vector,
            )
            if settings.cache.enabled and pipeline.generations is not None
            else None
        )
        # One service per feature; each folder's routes read theirs through its own dependency.
        self.search = SearchService(
            settings, self.policy, self.retrieval, self.recorder, self.profiles, self.cache
        )
        self.enrich = EnrichService(
            settings, self.policy, self.retrieval, self.recorder, self.profiles
        )
        self.ingest = IngestService(settings, self.policy, pipeline, self.recorder)
        # Token buckets per credential and team (serve_app/http/rate_limits.py).
        self.rate_limiter = RateLimiter.from_settings(
            settings.rate_limit, settings.cache.backend, settings.cache.redis_url
        )

    async def _graph_written(self, team_id: str) -> None:
        # The write is done; if the generation cannot be raised, cached answers may lag.
        await self.pipeline.bump_generations({team_id})

    @property
    def audit(self) -> AuditLog:
        """The audit log the recorder writes to (settable: tests swap in another)."""
        return self.recorder.log

    @audit.setter
    def audit(self, log: AuditLog) -> None:
        self.recorder.log = log

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when the embedder has its model and Milvus and Neo4j answer. The audit
        database is reported too; it counts for readiness only with audit.required_for_ready."""
        parts: dict[str, Any] = {"embedder": self.embedder, "milvus": self.store}
        if self.graph is not None:
            parts["neo4j"] = self.graph
        if self.reranker is not None:
            parts["reranker"] = self.reranker

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
                    asyncio.to_thread(self.audit.status), timeout=READY_TIMEOUT_S
                )
            except Exception as exc:
                return "audit", {"ready": False, "error": f"{type(exc).__name__}: {exc}"}

        checks = [one(n, b) for n, b in parts.items()]
        if self.audit.enabled:
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
