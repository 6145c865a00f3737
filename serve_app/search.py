"""rag.search_docs: search inside the caller's scope, audited (serve_app/retrieval.py runs
the pipeline)."""

from __future__ import annotations

from dataclasses import dataclass

from batch_ingest.chunks import strip_header
from deployments.errors import InvalidInput
from deployments.protocols import SearchHit
from serve_app.access import AccessContext
from serve_app.audit import request_audit, scope_resource
from serve_app.contracts import GraphInfo, Match, SearchDocsRequest, SearchDocsResponse, SourceRef
from serve_app.policy import Policy
from serve_app.recorder import AuditRecorder
from serve_app.request import RequestContext
from serve_app.retrieval import Retrieval
from serve_app.settings import GatewaySettings
from serve_app.snippets import best_snippet
from serve_app.timing import stage


@dataclass
class SearchService:
    settings: GatewaySettings
    policy: Policy
    retrieval: Retrieval
    recorder: AuditRecorder

    async def search_docs(self, req: SearchDocsRequest, rc: RequestContext) -> SearchDocsResponse:
        """Search inside the scope ``principal`` grants in ``req.team_id``; the decision is
        audited (allowed with the returned chunk ids, or denied with its reason).

        Raises:
            Forbidden: the team, mode, doc types or project are not granted (before searching).
            InvalidInput: top_k or the query exceed the configured bounds.
        """
        audit = request_audit(req, rc.principal, "search", scope_resource(req), req.query)
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
