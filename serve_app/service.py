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
from batch_ingest.chunks import strip_header
from batch_ingest.documents import SourceDocument
from batch_ingest.events import (
    IngestEventsResponse,
    InvalidEvent,
    MappedEvent,
    apply_events,
    count_statuses,
)
from batch_ingest.pipeline import IngestPipeline
from deployments.errors import Forbidden, InvalidInput
from deployments.protocols import (
    Embedder,
    GraphStore,
    Reranker,
    SearchHit,
    VectorStore,
)
from serve_app.access import AccessContext, check_ingest
from serve_app.audit import AuditLog, request_audit
from serve_app.contracts import (
    EnrichAnswerRequest,
    EnrichAnswerResponse,
    GraphInfo,
    IngestDocumentsResponse,
    IngestedDocument,
    Match,
    SearchDocsRequest,
    SearchDocsResponse,
    SourceRef,
)
from serve_app.enrich import enrich_answer as run_enrich
from serve_app.graph_tools import GraphTools
from serve_app.policy import Policy
from serve_app.recorder import AuditRecorder
from serve_app.request import RequestContext
from serve_app.retrieval import Retrieval
from serve_app.settings import GatewaySettings
from serve_app.snippets import best_snippet
from serve_app.timing import stage

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
        # The search pipeline rag.search_docs and rag.enrich_answer share.
        self.retrieval = Retrieval(
            settings=settings,
            embedder=embedder,
            store=store,
            graph=graph,
            reranker=reranker,
            count_tokens=count_tokens,
        )

    @property
    def audit(self) -> AuditLog:
        """The audit log the recorder writes to (settable: tests swap in another)."""
        return self.recorder.log

    @audit.setter
    def audit(self, log: AuditLog) -> None:
        self.recorder.log = log

    # --- rag.search_docs -----------------------------------------------------------------
    async def search_docs(self, req: SearchDocsRequest, rc: RequestContext) -> SearchDocsResponse:
        """Search inside the scope ``principal`` grants in ``req.team_id``; the decision is
        audited (allowed with the returned chunk ids, or denied with its reason).

        Raises:
            Forbidden: the team, mode, doc types or project are not granted (before searching).
            InvalidInput: top_k or the query exceed the configured bounds.
        """
        audit = request_audit(req, rc.principal, "search", _resource(req), req.query)
        with self.recorder.audited(rc, audit) as allowed:
            response = await self._search_docs(req, rc)
            allowed.fields = {
                "chunk_ids": [m.chunk_id for m in response.matches],
                "doc_ids": list(dict.fromkeys(m.source_ref.id for m in response.matches)),
            }
        return response

    async def _search_docs(self, req: SearchDocsRequest, rc: RequestContext) -> SearchDocsResponse:
        # Access first: a caller outside the scope learns nothing, not even about limits.
        with stage("access"):
            ctx = AccessContext.for_search(rc.principal, req, self.policy)
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
        found = await self.retrieval.run(req, ctx, flt, top_k, req.search_mode or cfg.mode)
        with stage("snippets"):
            matches = self._to_matches(found.hits, req)
        return SearchDocsResponse(
            degraded=bool(found.degraded),
            degraded_reasons=found.degraded,
            matches=matches,
            mode=found.mode,
            graph=GraphInfo(**found.graph) if found.graph else None,
            took_ms=rc.elapsed_ms,
            trace_id=rc.trace_id,
        )

    # --- rag.enrich_answer --------------------------------------------------------------
    async def enrich_answer(
        self, req: EnrichAnswerRequest, rc: RequestContext
    ) -> EnrichAnswerResponse:
        """Cite the caller's documents after the claims of ``req.draft_answer`` (search
        pipeline and scope of ``search_docs``; see serve_app/enrich.py); audited like it.

        Raises:
            Forbidden: the team, mode, doc types or project are not granted (before searching).
            InvalidInput: the draft exceeds ``enrich.max_draft_chars``.
        """
        audit = request_audit(req, rc.principal, "enrich", _resource(req), req.draft_answer)
        with self.recorder.audited(rc, audit) as allowed:
            response = await run_enrich(self.retrieval, self.settings, self.policy, req, rc)
            allowed.fields = {
                "chunk_ids": [s.chunk_id for s in response.sources],
                "doc_ids": [s.id for s in response.sources],
            }
        return response

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
        self, docs: list[SourceDocument], rc: RequestContext
    ) -> IngestDocumentsResponse:
        """Index ``docs`` after checking that the caller (``rc.principal``) may write every one
        of them.

        Raises:
            Forbidden: a document's team, doc type, visibility or project is not writable by
                the caller; nothing is written then.
            InvalidInput: too many documents or a document too long.
        """
        trace_id, principal, started = rc.trace_id, rc.principal, rc.started
        try:
            contexts = check_ingest(principal, docs, self.policy)
        except Forbidden as exc:
            doc = _failing_document(exc, docs)
            self.recorder.error(
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
            self.recorder.error(
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
            self.recorder.decision(
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

    async def ingest_events(
        self, events: list[MappedEvent | InvalidEvent], rc: RequestContext
    ) -> IngestEventsResponse:
        """Apply bus-event envelopes (``POST /ingest/events``): the write rules of
        ``ingest_documents`` per event's ``meta.team_id`` (a delete is checked against the
        stored document's doc type, visibility and project when the registry has it), every
        allowed event audited; then ``batch_ingest.events.apply_events``.

        Raises:
            Forbidden: an event the caller may not write; nothing is applied then.
            InvalidInput: too many events or a document too long.
        """
        trace_id, principal, started = rc.trace_id, rc.principal, rc.started
        valid = [e for e in events if isinstance(e, MappedEvent)]
        checked: list[tuple[int, MappedEvent, SourceDocument]] = []
        for i, ev in enumerate(events):
            if isinstance(ev, MappedEvent):
                checked.append((i, ev, await self._event_document(ev)))
        contexts: dict[str, AccessContext] = {}
        for i, _ev, doc in checked:
            where = f"events.{i}"
            try:
                ctx = contexts.get(doc.team_id)
                if ctx is None:
                    ctx = AccessContext.for_team(
                        principal, doc.team_id, self.policy, field_name=f"{where}.meta.team_id"
                    )
                    contexts[doc.team_id] = ctx
                ctx.check_write(doc, where)
            except Forbidden as exc:
                self.recorder.error(
                    exc,
                    trace_id,
                    principal,
                    started,
                    action="ingest.events",
                    team_id=doc.team_id,
                    resource=_doc_resource(doc),
                    doc_ids=[doc.doc_id],
                    declared_agent_id="",
                )
                raise
        docs = [ev.document for ev in valid if ev.document is not None]
        if len(events) > self.settings.ingest.max_documents:
            raise InvalidInput(
                f"events: at most {self.settings.ingest.max_documents} per request, "
                f"got {len(events)}",
                hint="split the batch into several requests",
                field="events",
            )
        self._check_ingest_limits(docs)
        for _, ev, doc in checked:
            self.recorder.decision(
                trace_id,
                principal,
                started,
                action="ingest.events",
                decision="allow",
                reason="granted",
                http_status=200,
                team_id=doc.team_id,
                resource=f"{_doc_resource(doc)}/{ev.envelope.type}@{ev.revision}",
                doc_ids=[doc.doc_id],
                subject=contexts[doc.team_id].user_id if principal.trusts_body else principal.sub,
            )
        results, degraded = await apply_events(self.pipeline, events)
        counts = count_statuses(results)
        return IngestEventsResponse(
            degraded=bool(degraded or counts["failed"]),
            degraded_reasons=degraded
            + [f"{r.event_id}: {r.error}" for r in results if r.status == "failed"],
            counts=counts,
            events=results,
            took_ms=round((time.perf_counter() - started) * 1000, 1),
            trace_id=trace_id,
        )

    async def _event_document(self, ev: MappedEvent) -> SourceDocument:
        """The document an event writes; for a delete, the stored one (its real doc type,
        visibility and project), or a public stand-in when the registry does not know it."""
        if ev.document is not None:
            return ev.document
        sources = self.pipeline.sources
        if sources is not None:
            row = await asyncio.to_thread(sources.get, ev.key)
            if row is not None and row.document is not None:
                return row.document
        team_id, doc_type, doc_id = ev.key
        return SourceDocument(team_id=team_id, doc_type=doc_type, doc_id=doc_id, text="-")

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


def _resource(req: Any) -> str:
    resource = f"team:{req.team_id}"
    if req.filters.project_id:
        resource += f"/project:{req.filters.project_id}"
    return resource


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
