"""Graph-scoped retrieval (a search's ``graph`` option): the documents linked to the entities
the query names, found in the caller's graph scope, either as the scope of the search
(``scope``) or as one more fused list (``boost``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from deployments.errors import BackendUnavailable
from deployments.protocols import GraphStore, SearchFilter, SearchHit, VectorStore
from serve_app.access import graph as graph_access
from serve_app.access.context import AccessContext
from serve_app.search.contracts import SearchDocsRequest
from serve_app.search.fusion import fuse
from serve_app.search.ranking import fuse_weighted
from serve_app.settings import GatewaySettings


class GraphLinks:
    """The graph's part of one search. ``graph`` None: the graph is disabled (a search that
    asks for it goes on without it and says so)."""

    def __init__(
        self, settings: GatewaySettings, graph: GraphStore | None, store: VectorStore
    ) -> None:
        self.settings = settings
        self.graph = graph
        self.store = store

    async def linked_docs(
        self, req: SearchDocsRequest, ctx: AccessContext, degraded: list[str]
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """``doc_id → graph score`` of the documents linked to the entities the query names
        (empty when the graph is down or disabled: the search goes on and says so), and what
        was found (the fields of the response's ``graph``)."""
        opt = req.graph
        assert opt is not None
        note = None
        try:
            if self.graph is None:
                raise BackendUnavailable(
                    "neo4j", "the graph is disabled in this deployment (graph_enabled: false)"
                )
            deadline = self.settings.search.graph_deadline_s
            try:
                async with asyncio.timeout(deadline):
                    found = await self.graph.related_docs(
                        req.query, graph_access.graph_scope(ctx), opt.max_entities, opt.max_docs
                    )
            except TimeoutError:
                raise BackendUnavailable("neo4j", f"no answer within {deadline:g} s") from None
        except BackendUnavailable as exc:
            degraded.append(f"graph unavailable, searched without it: {exc.message}")
            found, note = {"entities": [], "docs": {}}, "graph unavailable"
        entities = [e for e in found["entities"] if graph_access.may_see_entity(ctx, e["node"])]
        docs = dict(found["docs"])
        if not entities:
            docs = {}
            note = note or "the query names no entity of the graph in your scope"
        elif not docs:
            note = "no documents are linked to the entities the query names"
        info = dict(
            mode=opt.mode,
            entities=[
                {
                    "label": (e["node"].get("labels") or [""])[0],
                    "id": e["node"].get("id"),
                    "name": e["node"].get("name") or e["node"].get("title"),
                    "score": e["score"],
                }
                for e in entities
            ],
            linked_docs=len(docs),
            applied=bool(docs),
            note=note,
        )
        return docs, info

    async def boost(
        self,
        req: SearchDocsRequest,
        ctx: AccessContext,
        flt: SearchFilter,
        lists: dict[str, list[SearchHit]],
        linked: dict[str, float],
        mode: str,
        vector: Any,
        fetch: int,
        read_id: str,
        query_lexical: Mapping[int, float] | None = None,
    ) -> Sequence[SearchHit]:
        """Fuse the methods' lists with one more, ``graph``: the candidates of the linked
        documents ranked by their graph score. The linked documents' own best chunks are
        fetched too, so one outside the top ``fetch`` of every method can still surface."""
        assert req.graph is not None
        methods = tuple(m for m in ("dense", "bm25", "lexical") if m in lists)
        use_vector = vector if isinstance(vector, list) else None
        # A filter on many ids is slow (Milvus Lite scans); a large linked set only reorders
        # the candidates the methods found.
        extra: dict[str, list[SearchHit]] = {}
        if len(linked) <= self.settings.search.graph_fetch_max_docs:
            extra = await self.store.candidates(
                req.query,
                use_vector if "dense" in methods else None,
                replace(flt, doc_ids=tuple(linked)),
                fetch,
                methods,
                read_id,
                query_lexical,
            )
        for method, found in extra.items():
            have = {h.chunk.chunk_id for h in lists.get(method, [])}
            more = [h for h in found if h.chunk.chunk_id not in have and ctx.may_see(h.chunk)]
            lists[method] = sorted([*lists.get(method, []), *more], key=lambda h: -h.score)
        pool: dict[str, SearchHit] = {}
        for found in lists.values():
            for hit in found:
                if hit.chunk.doc_id in linked:
                    pool.setdefault(hit.chunk.chunk_id, hit)
        graph_list = sorted(
            (SearchHit(chunk=h.chunk, score=linked[h.chunk.doc_id]) for h in pool.values()),
            key=lambda h: (-h.score, h.chunk.chunk_id),
        )
        weight = req.graph.weight
        if mode != "hybrid":
            return fuse_weighted(
                {mode: lists[mode], "graph": graph_list},
                {mode: 1.0, "graph": weight},
                self.settings.search.fusion_normalisation,
            )
        return fuse({**lists, "graph": graph_list}, req, self.settings, extra={"graph": weight})
