"""The search pipeline shared by rag.search_docs and rag.enrich_answer: the candidates of
each method (dense, BM25, and the graph when asked), the result filter, fusion, rerank, the
score threshold, near-duplicates and the token budget."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from batch_ingest.chunks import strip_header
from deployments.errors import BackendUnavailable
from deployments.protocols import (
    Embedder,
    GraphStore,
    Reranker,
    SearchFilter,
    SearchHit,
    VectorStore,
)
from serve_app.access.context import AccessContext
from serve_app.search.contracts import SearchDocsRequest
from serve_app.search.fusion import fuse
from serve_app.search.graph_links import GraphLinks
from serve_app.search.passages import PassageMemo
from serve_app.search.query_vectors import QueryVectors
from serve_app.search.ranking import (
    collapse_near_duplicates,
    drop_near_duplicates,
    within_budget,
)
from serve_app.settings import GatewaySettings, NearDuplicates
from serve_app.timing import stage


@dataclass
class RetrievalResult:
    """What one retrieval found: the hits in order, the mode actually used, why it degraded
    (empty: it did not), and what graph-scoped retrieval found (``None``: not asked)."""

    hits: list[SearchHit]
    mode: str
    degraded: list[str]
    graph: dict[str, Any] | None = None
    # Chunk id of a hit that nearly repeats an earlier one of another document -> that
    # earlier hit's chunk id (``search.near_duplicates: collapse``).
    duplicate_of: dict[str, str] = field(default_factory=dict)


@dataclass
class _MethodLists:
    """Each method's candidates, the mode that ran (BM25 when the embedder failed), the
    query's vector and its learned sparse weights (``None``: not fused)."""

    lists: dict[str, list[SearchHit]]
    mode: str
    vector: list[float] | None
    lexical: dict[int, float] | None


class Retrieval:
    """One search over the backends: ``run`` answers a ``SearchDocsRequest`` inside an
    ``AccessContext``. Holds no per-request state."""

    def __init__(
        self,
        *,
        settings: GatewaySettings,
        embedder: Embedder,
        store: VectorStore,
        graph: GraphStore | None,
        reranker: Reranker | None,
        count_tokens: Callable[[str], int],
    ) -> None:
        self.settings = settings
        self.store = store
        self.reranker = reranker
        # Counts tokens of returned passages for max_context_tokens (the embedder's tokenizer).
        self.count_tokens = count_tokens
        # Shingles and sentences of the passages searches returned lately (near-duplicates,
        # snippets).
        self.passages = PassageMemo(settings.search.passage_memo)
        # The query's embedding (and learned sparse weights, other models' vectors).
        self.queries = QueryVectors(settings, embedder)
        self.graph = GraphLinks(settings, graph, store)

    async def run(
        self,
        req: SearchDocsRequest,
        ctx: AccessContext,
        flt: SearchFilter,
        top_k: int,
        mode: str,
        *,
        vector: list[float] | None = None,
        embed_error: str | None = None,
        read_id: str = "",
        generation: int | None = None,
        near_duplicates: NearDuplicates | None = None,
    ) -> RetrievalResult:
        """The hits of ``req.query`` inside ``ctx``/``flt``: candidates, the result filter,
        fusion, rerank, score threshold, near-duplicates (``near_duplicates``, default
        ``search.near_duplicates``) and token budget, in search order.

        ``vector`` is the query's embedding when the caller embedded it already (one batch
        for many queries); ``embed_error`` what that embedding failed with (the search falls
        back to BM25 and says so); with neither, ``req.query`` is embedded here. Retrievals
        sharing a ``read_id`` (the claims of one enrich request) are one read for the
        Retriever's consistency check; ``generation`` is the team's index generation when the
        caller read it after the request arrived (the in-memory index may then skip that
        check: deployments/vector_store/memindex/hot.py, ``HotIndex.fresh``)."""
        degraded: list[str] = []
        linked: dict[str, float] = {}
        graph: dict[str, Any] | None = None
        if req.graph is not None:
            linked, graph = await self.graph.linked_docs(req, ctx, degraded)
            if req.graph.mode == "scope" and linked:
                flt = replace(flt, doc_ids=tuple(linked))

        use_rerank = self.reranker is not None and (req.rerank is not False)
        if req.rerank and self.reranker is None:
            degraded.append("rerank requested but no reranker is configured")
        fetch = top_k * self.settings.search.candidate_multiplier
        if use_rerank:
            fetch = max(fetch, self.settings.reranker.candidates)
        # Every call of this search carries one read id, so the Retriever checks once that
        # it is up to date.
        read = read_id or uuid.uuid4().hex
        found = await self._method_lists(
            req, flt, fetch, mode, vector, embed_error, read, generation, degraded
        )
        mode = found.mode
        # The store filtered by team, visibility and doc type already; this drops chunks of
        # projects and skills whose policy denies the caller, and anything a store bug let by.
        with stage("visible"):
            lists = _visible(found.lists, ctx)
        if linked and req.graph is not None and req.graph.mode == "boost":
            hits = await self.graph.boost(
                req, ctx, flt, lists, linked, mode, found.vector, fetch, read, found.lexical
            )
        else:
            with stage("fuse"):
                hits = fuse(lists, req, self.settings) if mode == "hybrid" else lists[mode]

        if use_rerank and hits:
            try:
                hits = await self._rerank(req.query, hits)
            except BackendUnavailable as exc:
                degraded.append(f"reranker unavailable, fused order kept: {exc.message}")
        kept, duplicate_of = self._post(
            req, hits, top_k, near_duplicates or self.settings.search.near_duplicates
        )
        return RetrievalResult(kept, mode, degraded, graph, duplicate_of)

    async def _method_lists(
        self,
        req: SearchDocsRequest,
        flt: SearchFilter,
        fetch: int,
        mode: str,
        vector: list[float] | None,
        embed_error: str | None,
        read: str,
        generation: int | None,
        degraded: list[str],
    ) -> _MethodLists:
        """Each method's candidates of ``mode``, the query embedded first when no vector came
        with it; an embedder that fails turns the search into BM25 (noted in ``degraded``).

        With the in-memory index both methods cost about a millisecond: one call after the
        embedding (one hop, one change-log check). Against Milvus, BM25 needs no vector and
        runs while the query is embedded."""
        together = mode == "hybrid" and self.settings.milvus.memory_index.enabled
        bm25_task = (
            asyncio.create_task(
                self._candidates(req.query, None, flt, fetch, ("bm25",), read, None, generation)
            )
            if mode in ("hybrid", "bm25") and not together
            else None
        )
        query_lexical: dict[int, float] | None = None
        try:
            lists: dict[str, list[SearchHit]] = {}
            if mode in ("hybrid", "dense"):
                if embed_error is None:
                    try:
                        vector = await self.queries.vector(req.query, vector)
                    except BackendUnavailable as exc:
                        embed_error = exc.message
                if embed_error is not None:
                    # Keyword search still answers; say so at the top of the response.
                    degraded.append(f"embedder unavailable, fell back to BM25 only: {embed_error}")
                    mode = "bm25"
                    if bm25_task is None:
                        bm25_task = asyncio.create_task(
                            self._candidates(req.query, None, flt, fetch, ("bm25",), read)
                        )
                else:
                    methods: tuple[str, ...] = ("dense", "bm25") if together else ("dense",)
                    query_lexical = await self.queries.sparse(req, mode)
                    if query_lexical:
                        methods += ("lexical",)
                    lists |= await self._candidates(
                        req.query, vector, flt, fetch, methods, read, query_lexical, generation
                    )
            if bm25_task is not None:
                lists |= await bm25_task
        finally:
            if bm25_task is not None:
                if not bm25_task.done():
                    bm25_task.cancel()
                elif not bm25_task.cancelled():
                    bm25_task.exception()  # retrieved: an error here surfaced another way
        return _MethodLists(lists, mode, vector, query_lexical)

    def _post(
        self,
        req: SearchDocsRequest,
        hits: Sequence[SearchHit],
        top_k: int,
        duplicates: NearDuplicates,
    ) -> tuple[list[SearchHit], dict[str, str]]:
        """The score threshold first (it is per passage, and duplicates score lower than the
        copy they repeat), then near-duplicates (``duplicates``: collapse, drop or off) only
        until ``top_k`` passages are kept, then the token budget (a collapsed duplicate's
        text is its original's, counted once). Reads ``hits`` in order and only as far as it
        needs (fusion makes each hit when it is read: ranking.Fused)."""
        cfg = self.settings.search
        duplicate_of: dict[str, str] = {}
        with stage("post"):
            min_score = req.min_score if req.min_score is not None else cfg.min_score
            passing: Iterable[SearchHit] = hits
            if min_score is not None:
                passing = (h for h in hits if h.score >= min_score)
            threshold = cfg.near_duplicate_threshold
            if duplicates == "collapse":
                kept, duplicate_of = collapse_near_duplicates(
                    passing, self.passages.shingles, threshold, limit=top_k
                )
            elif duplicates == "drop":
                kept = drop_near_duplicates(passing, self.passages.shingles, threshold, top_k)
            else:
                kept = list(islice(passing, top_k))
            budget = req.max_context_tokens or cfg.max_context_tokens
            if budget is not None:

                def body(hit: SearchHit) -> str:
                    return "" if hit.chunk.chunk_id in duplicate_of else _body(hit)

                kept = within_budget(kept, body, self.count_tokens, budget)
                # A prefix: an original is kept wherever a duplicate of it is.
                left = {h.chunk.chunk_id for h in kept}
                duplicate_of = {k: v for k, v in duplicate_of.items() if k in left}
        return kept, duplicate_of

    async def _candidates(
        self,
        query: str,
        vector: list[float] | None,
        flt: SearchFilter,
        fetch: int,
        methods: tuple[str, ...],
        read_id: str,
        query_lexical: Mapping[int, float] | None = None,
        generation: int | None = None,
    ) -> dict[str, list[SearchHit]]:
        deadline = self.settings.search.store_deadline_s
        # Only what is set is passed (a store written before an argument need not know it).
        more: dict[str, Any] = {"query_lexical": query_lexical} if query_lexical else {}
        if generation is not None:
            more["generation"] = generation
        if "dense" in methods:
            vectors = await self.queries.models.vectors(query, vector)
            if vectors is not None:  # the Retriever picks the one of the version it reads
                more["query_vectors"] = vectors
        with stage("+".join(methods)):
            try:
                async with asyncio.timeout(deadline):
                    return await self.store.candidates(
                        query, vector, flt, fetch, methods, read_id, **more
                    )
            except TimeoutError:
                raise BackendUnavailable(
                    "milvus", f"no candidates ({'+'.join(methods)}) within {deadline:g} s"
                ) from None

    async def _rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
        assert self.reranker is not None
        deadline = self.settings.search.rerank_deadline_s
        try:
            scores = await asyncio.wait_for(
                self.reranker.rerank(query, [strip_header(h.chunk) for h in hits]), deadline
            )
        except TimeoutError:
            raise BackendUnavailable("reranker", f"no answer within {deadline:g} s") from None
        rescored = [
            SearchHit(chunk=h.chunk, score=float(s), scores={**h.scores, "rerank": float(s)})
            for h, s in zip(hits, scores, strict=True)
        ]
        return sorted(rescored, key=lambda h: h.score, reverse=True)


def _visible(lists: dict[str, list[SearchHit]], ctx: AccessContext) -> dict[str, list[SearchHit]]:
    """Each list without the hits ``ctx`` may not see; a record found by several methods is
    judged once (by identity: two reads of one chunk that differ are each judged)."""
    chunks = {id(hit.chunk): hit.chunk for hits in lists.values() for hit in hits}
    verdicts = ctx.may_see_each(chunks.values())
    hidden = {key for key, seen in zip(chunks, verdicts, strict=True) if not seen}
    if not hidden:
        return lists
    return {
        method: [hit for hit in hits if id(hit.chunk) not in hidden]
        for method, hits in lists.items()
    }


def _body(hit: SearchHit) -> str:
    return strip_header(hit.chunk)
