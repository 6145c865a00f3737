"""rag.search_docs: search inside the caller's scope, audited (serve_app/search/retrieval.py runs
the pipeline)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deployments.errors import InvalidInput
from deployments.protocols import SearchHit
from serve_app.access.policy import Policy
from serve_app.audit.log import request_audit, scope_resource
from serve_app.audit.recorder import AuditRecorder
from serve_app.contracts import ProfileInfo
from serve_app.metrics import record_cache, record_search
from serve_app.profiles import DEFAULT_PROFILES, ProfileSet, SearchPlan, plan_search
from serve_app.request import RequestContext
from serve_app.search.cache.semantic import Lookup, SemanticCache
from serve_app.search.contracts import (
    CacheInfo,
    GraphInfo,
    SearchDocsRequest,
    SearchDocsResponse,
)
from serve_app.search.retrieval import Retrieval
from serve_app.search.scope import SearchScope, search_scope
from serve_app.search.snippets import terms
from serve_app.settings import GatewaySettings
from serve_app.timing import stage


@dataclass
class SearchService:
    settings: GatewaySettings
    policy: Policy
    retrieval: Retrieval
    recorder: AuditRecorder
    profiles: ProfileSet = DEFAULT_PROFILES
    # None: no semantic cache (cache.enabled false, or no state database for generations).
    cache: SemanticCache | None = None

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
            record_search(response.mode, len(response.matches), response.degraded_reasons)
            allowed.fields = {
                "chunk_ids": [m.chunk_id for m in response.matches],
                "doc_ids": list(dict.fromkeys(m.source_ref.id for m in response.matches)),
            }
            if response.cache is not None and response.cache.hit:
                allowed.reason = "granted;cache_hit"  # same scope, answered from the cache
            elif response.mode == "off":
                allowed.reason = "granted;rag_off"
        return response

    async def _search_docs(self, req: SearchDocsRequest, rc: RequestContext) -> SearchDocsResponse:
        """Access and the profile's plan, the semantic cache, the search, the answer (cached
        for the next caller of the same scope)."""
        scope, plan, profile = self._plan(req, rc)
        if plan.rag_mode == "off":
            return SearchDocsResponse(
                matches=[],
                mode="off",
                profile=profile,
                notice=f"RAG is off for profile {scope.agent.name!r}: nothing was searched",
                took_ms=rc.elapsed_ms,
                trace_id=rc.trace_id,
            )
        if plan.updates:
            req = req.model_copy(update=plan.updates)
        lookup = await self._lookup(req, scope, plan)
        if lookup.hit is not None:
            stored = json.loads(lookup.hit.value)
            stored.update(took_ms=rc.elapsed_ms, trace_id=rc.trace_id)
            cached = SearchDocsResponse.model_validate(stored)
            cached.profile, cached.cache = profile, self._cache_info(lookup)
            return cached
        found = await self.retrieval.run(
            req,
            scope.ctx,
            scope.flt,
            plan.top_k,
            plan.method,
            vector=lookup.vector,
            embed_error=lookup.embed_error,
            generation=lookup.generation,
        )
        with stage("snippets"):
            matches = self._to_matches(found.hits, req, found.duplicate_of)
        response = SearchDocsResponse.model_validate(
            {
                "degraded": bool(found.degraded),
                "degraded_reasons": found.degraded,
                "matches": matches,
                "mode": found.mode,
                "graph": GraphInfo(**found.graph) if found.graph else None,
                "profile": profile,
                "cache": self._cache_info(lookup) if self.cache is not None else None,
                "took_ms": rc.elapsed_ms,
                "trace_id": rc.trace_id,
            }
        )
        if self.cache is not None and not response.degraded:
            with stage("cache_put"):
                payload = response.model_dump_json(
                    exclude={"profile", "cache", "took_ms", "trace_id"}
                )
                await self.cache.put(lookup, payload.encode())
        return response

    def _plan(
        self, req: SearchDocsRequest, rc: RequestContext
    ) -> tuple[SearchScope, SearchPlan, ProfileInfo]:
        """Access first (a caller outside the scope learns nothing, not even about limits),
        then the request's bounds and what the agent's profile makes of it.

        Raises:
            Forbidden: the scope does not grant the request.
            InvalidInput: top_k or the query exceed the configured bounds.
        """
        with stage("access"):
            scope = search_scope(
                rc,
                self.policy,
                self.profiles,
                team_id=req.team_id,
                user_id=req.user_id,
                agent_id=req.agent_id,
                visibility=req.visibility,
                filters=req.filters,
            )
        cfg = self.settings.search
        top_k = req.top_k or cfg.default_top_k
        if top_k > cfg.max_top_k:
            raise InvalidInput(f"top_k must be at most {cfg.max_top_k}, got {top_k}", field="top_k")
        if len(req.query) > cfg.max_query_chars:
            raise InvalidInput(
                f"query is {len(req.query)} characters; the limit is {cfg.max_query_chars}",
                field="query",
            )
        plan = plan_search(
            scope.agent,
            requested_mode=req.rag_mode,
            top_k=top_k,
            method=req.search_mode or cfg.mode,
            rerank=req.rerank,
            graph=req.graph is not None,
            min_score=req.min_score,
            max_context_tokens=req.max_context_tokens,
            method_asked=req.search_mode is not None,
        )
        name = scope.agent.name
        return (
            scope,
            plan,
            ProfileInfo(name=name, rag_mode=plan.rag_mode, clamped=list(plan.clamped)),
        )

    async def _lookup(self, req: SearchDocsRequest, scope: SearchScope, plan: SearchPlan) -> Lookup:
        """This request's place in the semantic cache and what it holds there (``bypass``
        without a cache)."""
        if self.cache is None:
            return Lookup(status="bypass")
        agent = scope.agent
        with stage("cache"):
            lookup = await self.cache.lookup(
                agent_id=agent.agent_id,
                scope=scope.ctx.scope_key(),
                flt=scope.flt,
                shape=_shape(req, plan.top_k, plan.method),
                query=req.query,
                dense=plan.method != "bm25",
                ttl_s=self.cache.ttl_for(agent.profile.cache_ttl_s),
            )
        record_cache(lookup.status)
        return lookup

    def _cache_info(self, lookup: Lookup) -> CacheInfo:
        assert self.cache is not None
        hit = lookup.hit
        return CacheInfo(
            hit=hit is not None,
            status=lookup.status,
            backend=self.cache.backend,
            similarity=round(hit.similarity, 4) if hit else None,
            age_s=round(hit.age_s, 1) if hit else None,
        )

    def _to_matches(
        self, hits: list[SearchHit], req: SearchDocsRequest, duplicate_of: dict[str, str]
    ) -> list[dict[str, Any]]:
        """Each hit as the fields of a ``Match`` (a collapsed duplicate with no snippet and
        the chunk id it repeats): the response validates them all in one call (~40 % less
        than a ``Match`` and a ``SourceRef`` made per hit)."""
        out = []
        wanted = terms(req.query)
        chars = self.settings.search.snippet_chars
        for hit in hits:
            c = hit.chunk
            original = duplicate_of.get(c.chunk_id)
            out.append(
                {
                    "score": round(hit.score, 6),
                    "title": c.title or c.heading or c.doc_id,
                    "snippet": ""
                    if original
                    else self.retrieval.passages.of(c).snippet(wanted, chars),
                    "source_ref": {
                        "type": c.doc_type,
                        "id": c.doc_id,
                        "url": c.url,
                        "team_id": c.team_id,
                        "doc_type": c.doc_type,
                        "chunk_index": c.chunk_index,
                    },
                    "chunk_id": c.chunk_id,
                    "scores": hit.scores if req.explain else None,
                    "duplicate_of": original,
                }
            )
        return out


def _shape(req: SearchDocsRequest, top_k: int, method: str) -> dict[str, object]:
    """What decides a search's answer besides its query, scope and filter: the request after
    its profile (top_k and method as they run)."""
    shape = req.model_dump(
        exclude={"team_id", "dao_id", "microdao_id", "query", "agent_id", "user_id", "filters"}
    )
    shape.update(top_k=top_k, search_mode=method)
    return shape
