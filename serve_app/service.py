"""GatewayService: the logic behind the routes, over the backend protocols.

The Serve ingress builds it with handle proxies; unit tests build it with fakes. Routes stay
thin and call one method each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from batch_ingest.chunking import whitespace_tokens
from batch_ingest.documents import SourceDocument
from batch_ingest.pipeline import IngestPipeline, strip_header
from deployments.config import GatewaySettings
from deployments.errors import BackendUnavailable, Forbidden, GatewayError, InvalidInput
from deployments.protocols import Embedder, GraphStore, Reranker, SearchHit, VectorStore
from serve_app.access import DEV_SUBJECT, AccessContext, check_ingest
from serve_app.audit import AuditLog, AuditRecord, sha256_text
from serve_app.auth.principal import Principal
from serve_app.contracts import (
    IngestDocumentsResponse,
    IngestedDocument,
    Match,
    SearchDocsRequest,
    SearchDocsResponse,
    SourceRef,
)
from serve_app.policy import Policy
from serve_app.ranking import drop_near_duplicates, fuse_rrf, fuse_weighted, within_budget
from serve_app.snippets import best_snippet

logger = logging.getLogger(__name__)


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
    ) -> None:
        self.settings = settings
        # Every allow/deny decision goes here (asynchronously; see serve_app/audit.py).
        self.audit = audit if audit is not None else AuditLog(settings.audit)
        # Roles, doc types and resource policies; the file of auth.policy_file by default.
        self.policy = policy if policy is not None else Policy.load(settings.auth.policy_file)
        # Counts tokens of returned passages for max_context_tokens (the embedder's tokenizer).
        self.count_tokens = count_tokens
        self.embedder = embedder
        self.store = store
        self.graph = graph
        self.reranker = reranker
        self.pipeline = pipeline

    # --- rag.search_docs -----------------------------------------------------------------
    async def search_docs(
        self, req: SearchDocsRequest, trace_id: str, principal: Principal
    ) -> SearchDocsResponse:
        """Search inside the scope ``principal`` grants in ``req.team_id``; the decision is
        audited (allowed with the returned chunk ids, or denied with its reason).

        Raises:
            Forbidden: the team, mode, doc types or project are not granted (before searching).
            InvalidInput: top_k or the query exceed the configured bounds.
        """
        started = time.perf_counter()
        resource = f"team:{req.team_id}"
        if req.filters.project_id:
            resource += f"/project:{req.filters.project_id}"
        audit = {
            "action": "search",
            "team_id": req.team_id,
            "resource": resource,
            "query_sha256": sha256_text(req.query),
            "query_text": req.query,
            "declared_agent_id": req.agent_id if not principal.agent_id else "",
            # A dev-mode caller has no verified subject; the body's user_id is all there is.
            "subject": (req.user_id or DEV_SUBJECT) if principal.trusts_body else principal.sub,
        }
        try:
            response = await self._search_docs(req, trace_id, principal, started)
        except GatewayError as exc:
            self.audit_error(exc, trace_id, principal, started, **audit)
            raise
        self.audit_decision(
            trace_id,
            principal,
            started,
            decision="allow",
            reason="granted",
            http_status=200,
            chunk_ids=[m.chunk_id for m in response.matches],
            doc_ids=list(dict.fromkeys(m.source_ref.id for m in response.matches)),
            **audit,
        )
        return response

    async def _search_docs(
        self, req: SearchDocsRequest, trace_id: str, principal: Principal, started: float
    ) -> SearchDocsResponse:
        # Access first: a caller outside the scope learns nothing, not even about limits.
        ctx = AccessContext.for_search(principal, req, self.policy)
        flt = ctx.search_filter(req.filters)
        cfg = self.settings.search
        top_k = req.top_k or cfg.default_top_k
        if top_k > cfg.max_top_k:
            raise InvalidInput(f"top_k must be at most {cfg.max_top_k}, got {top_k}", field="top_k")
        if len(req.query) > cfg.max_query_chars:
            raise InvalidInput(
                f"query is {len(req.query)} characters; the limit is {cfg.max_query_chars}",
                field="query",
            )
        mode = req.search_mode or cfg.mode
        degraded: list[str] = []

        use_rerank = self.reranker is not None and (req.rerank is not False)
        if req.rerank and self.reranker is None:
            degraded.append("rerank requested but no reranker is configured")
        fetch = top_k * cfg.candidate_multiplier
        if use_rerank:
            fetch = max(fetch, self.settings.reranker.candidates)
        # BM25 needs no vector: its search runs while the query is embedded.
        bm25_task = (
            asyncio.create_task(self.store.candidates(req.query, None, flt, fetch, ("bm25",)))
            if mode in ("hybrid", "bm25")
            else None
        )
        try:
            lists: dict[str, list[SearchHit]] = {}
            if mode in ("hybrid", "dense"):
                try:
                    vector = (await self.embedder.embed([req.query], "query"))[0]
                except BackendUnavailable as exc:
                    # Keyword search still answers; say so at the top of the response.
                    degraded.append(f"embedder unavailable, fell back to BM25 only: {exc.message}")
                    mode = "bm25"
                    if bm25_task is None:
                        bm25_task = asyncio.create_task(
                            self.store.candidates(req.query, None, flt, fetch, ("bm25",))
                        )
                else:
                    lists |= await self.store.candidates(
                        req.query, _as_list(vector), flt, fetch, ("dense",)
                    )
            if bm25_task is not None:
                lists |= await bm25_task
        finally:
            if bm25_task is not None:
                if not bm25_task.done():
                    bm25_task.cancel()
                elif not bm25_task.cancelled():
                    bm25_task.exception()  # retrieved: an error here surfaced another way
        # The store filtered by team, visibility and doc type already; this drops chunks of
        # projects and skills whose policy denies the caller, and anything a store bug let by.
        lists = {m: [h for h in found if ctx.may_see(h.chunk)] for m, found in lists.items()}
        hits = self._fuse(lists, req) if mode == "hybrid" else lists[mode]

        if use_rerank and hits:
            try:
                hits = await self._rerank(req.query, hits)
            except BackendUnavailable as exc:
                degraded.append(f"reranker unavailable, fused order kept: {exc.message}")

        # The score threshold first (it is per passage, and duplicates score lower than the
        # copy they repeat), then near-duplicates only until top_k passages are kept.
        min_score = req.min_score if req.min_score is not None else cfg.min_score
        if min_score is not None:
            hits = [h for h in hits if h.score >= min_score]
        hits = drop_near_duplicates(hits, _body, cfg.near_duplicate_threshold, limit=top_k)
        budget = req.max_context_tokens or cfg.max_context_tokens
        if budget is not None:
            hits = within_budget(hits, _body, self.count_tokens, budget)
        matches = self._to_matches(hits, req)
        return SearchDocsResponse(
            degraded=bool(degraded),
            degraded_reasons=degraded,
            matches=matches,
            mode=mode,
            took_ms=round((time.perf_counter() - started) * 1000, 1),
            trace_id=trace_id,
        )

    # --- audit --------------------------------------------------------------------------
    def audit_decision(
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
        if started is not None:
            fields.setdefault("latency_ms", round((time.perf_counter() - started) * 1000, 2))
        try:
            self.audit.record(AuditRecord(trace_id=trace_id, **fields))
        except Exception:  # the audit log must never fail a request
            logger.exception("audit record could not be queued")

    def audit_error(
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
        reason = getattr(exc, "reason", None) or exc.code
        self.audit_decision(
            trace_id,
            principal,
            started,
            decision="deny" if denied else "allow",
            reason=reason if denied else f"granted;{exc.code}",
            http_status=exc.status_code,
            **fields,
        )

    def _fuse(self, lists: dict[str, list[SearchHit]], req: SearchDocsRequest) -> list[SearchHit]:
        cfg = self.settings.search
        weights = (
            req.weights.model_dump()
            if req.weights is not None
            else {"dense": cfg.dense_weight, "bm25": cfg.bm25_weight}
        )
        if (req.fusion or cfg.fusion) == "weighted":
            return fuse_weighted(lists, weights, cfg.fusion_normalisation)
        # RRF is unweighted unless the caller sends weights.
        return fuse_rrf(lists, cfg.rrf_k, weights if req.weights is not None else None)

    async def _rerank(self, query: str, hits: list[SearchHit]) -> list[SearchHit]:
        assert self.reranker is not None
        scores = await self.reranker.rerank(query, [strip_header(h.chunk) for h in hits])
        rescored = [
            SearchHit(chunk=h.chunk, score=float(s), scores={**h.scores, "rerank": float(s)})
            for h, s in zip(hits, scores, strict=True)
        ]
        return sorted(rescored, key=lambda h: h.score, reverse=True)

    def _to_matches(self, hits: list[SearchHit], req: SearchDocsRequest) -> list[Match]:
        out = []
        for hit in hits:
            c = hit.chunk
            out.append(
                Match(
                    score=round(hit.score, 6),
                    title=c.title or c.heading or c.doc_id,
                    snippet=best_snippet(
                        strip_header(c), req.query, self.settings.search.snippet_chars
                    ),
                    source_ref=SourceRef(
                        type=c.doc_type,
                        id=c.doc_id,
                        url=c.url,
                        team_id=c.team_id,
                        doc_type=c.doc_type,
                        chunk_index=c.chunk_index,
                    ),
                    chunk_id=c.chunk_id,
                    scores=hit.scores if req.explain else None,
                )
            )
        return out

    # --- ingestion ----------------------------------------------------------------------
    async def ingest_documents(
        self, docs: list[SourceDocument], trace_id: str, principal: Principal
    ) -> IngestDocumentsResponse:
        """Index ``docs`` after checking that ``principal`` may write every one of them.

        Raises:
            Forbidden: a document's team, doc type, visibility or project is not writable by
                the caller; nothing is written then.
            InvalidInput: too many documents or a document too long.
        """
        started = time.perf_counter()
        try:
            contexts = check_ingest(principal, docs, self.policy)
        except Forbidden as exc:
            doc = _failing_document(exc, docs)
            self.audit_error(
                exc,
                trace_id,
                principal,
                started,
                action="ingest",
                team_id=doc.team_id if doc else "",
                resource=_doc_resource(doc) if doc else "",
                doc_ids=[doc.doc_id] if doc else None,
                declared_agent_id="",
            )
            raise
        try:
            self._check_ingest_limits(docs)
        except InvalidInput as exc:
            # Access was granted; the request is refused for its size.
            self.audit_error(
                exc,
                trace_id,
                principal,
                started,
                action="ingest",
                team_id=docs[0].team_id if docs else "",
                doc_ids=[d.doc_id for d in docs[:1000]],
            )
            raise
        for doc in docs:
            ctx = contexts[doc.team_id]
            self.audit_decision(
                trace_id,
                principal,
                started,
                action="ingest",
                decision="allow",
                reason="granted",
                http_status=200,
                team_id=doc.team_id,
                resource=_doc_resource(doc),
                doc_ids=[doc.doc_id],
                subject=ctx.user_id if principal.trusts_body else principal.sub,
            )
        report = await self.pipeline.ingest(docs)
        counts = {
            s: sum(r.status == s for r in report.results)
            for s in ("indexed", "unchanged", "failed")
        }
        return IngestDocumentsResponse(
            degraded=bool(report.degraded or counts["failed"]),
            degraded_reasons=report.degraded + [f"{r.doc_id}: {r.error}" for r in report.failed],
            documents=[IngestedDocument(**vars(r)) for r in report.results],
            took_ms=report.took_ms,
            trace_id=trace_id,
            **counts,
        )

    def _check_ingest_limits(self, docs: list[SourceDocument]) -> None:
        limits = self.settings.ingest
        if len(docs) > limits.max_documents:
            raise InvalidInput(
                f"documents: at most {limits.max_documents} per request, got {len(docs)}",
                hint="split the batch into several requests",
                field="documents",
            )
        for i, doc in enumerate(docs):
            if len(doc.text) > limits.max_document_chars:
                raise InvalidInput(
                    f"documents.{i}.text: {len(doc.text)} characters, the limit is "
                    f"{limits.max_document_chars}",
                    field=f"documents.{i}.text",
                )

    # --- health -------------------------------------------------------------------------
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
                return name, await asyncio.wait_for(backend.status(), timeout=10)
            except Exception as exc:
                return name, {"ready": False, "error": f"{type(exc).__name__}: {exc}"}

        async def audit() -> tuple[str, dict[str, Any]]:
            try:
                return "audit", await asyncio.wait_for(
                    asyncio.to_thread(self.audit.status), timeout=10
                )
            except Exception as exc:
                return "audit", {"ready": False, "error": f"{type(exc).__name__}: {exc}"}

        checks = [one(n, b) for n, b in parts.items()]
        if self.audit.enabled:
            checks.append(audit())
        results = dict(await asyncio.gather(*checks))
        optional = set() if self.settings.audit.required_for_ready else {"audit"}
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


def _failing_document(exc: Forbidden, docs: list[SourceDocument]) -> SourceDocument | None:
    """The document a ``check_ingest`` refusal names (``documents.<i>....``)."""
    parts = (exc.field or "").split(".")
    if len(parts) > 1 and parts[0] == "documents" and parts[1].isdigit():
        i = int(parts[1])
        if i < len(docs):
            return docs[i]
    return None


def _doc_resource(doc: SourceDocument) -> str:
    resource = f"team:{doc.team_id}"
    if doc.project_id:
        resource += f"/project:{doc.project_id}"
    return f"{resource}/{doc.doc_type}:{doc.doc_id}"


def _as_list(vector: Any) -> list[float] | None:
    if vector is None:
        return None
    return [float(x) for x in vector]


def _body(hit: SearchHit) -> str:
    return strip_header(hit.chunk)
