"""The search pipeline shared by rag.search_docs and rag.enrich_answer: the candidates of
each method (dense, BM25, and the graph when asked), the result filter, fusion, rerank, the
score threshold, near-duplicates and the token budget."""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
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
from serve_app.access import graph as graph_access
from serve_app.access.context import AccessContext
from serve_app.search.contracts import SearchDocsRequest
from serve_app.search.passages import PassageMemo
from serve_app.search.query_models import QueryModels
from serve_app.search.ranking import (
    adaptive_weights,
    collapse_near_duplicates,
    drop_near_duplicates,
    fuse_rrf,
    fuse_weighted,
    within_budget,
)
from serve_app.settings import GatewaySettings, NearDuplicates
from serve_app.timing import stage

# Queries whose learned sparse weights are remembered between the embedding and the search
# (the semantic cache and enrich embed first, then search with the vector they got).
LEXICAL_MEMORY = 512


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
        self.embedder = embedder
        self.store = store
        self.graph = graph
        self.reranker = reranker
        # Counts tokens of returned passages for max_context_tokens (the embedder's tokenizer).
        self.count_tokens = count_tokens
        # Shingles and sentences of the passages searches returned lately (near-duplicates,
        # snippets).
        self.passages = PassageMemo(settings.search.passage_memo)
        # A BGE-M3 embedder's learned sparse weights of recent queries (``embed_queries``).
        self._lexical: OrderedDict[str, dict[int, float]] = OrderedDict()
        # During a change of model: the query's vector of each served model.
        models = [e.embed_model_tag for e in settings.embedders]
        self.query_models = QueryModels(
            embedder, models[0], models[1:], settings.search.embed_deadline_s
        )

    @property
    def lexical(self) -> bool:
        """Whether hybrid searches fuse the learned sparse list (the embedder makes it)."""
        return self.settings.embedder.lexical

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
            linked, graph = await self._graph_linked_docs(req, ctx, degraded)
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
            hits = await self._graph_boost(
                req, ctx, flt, lists, linked, mode, found.vector, fetch, read, found.lexical
            )
        else:
            with stage("fuse"):
                hits = self._fuse(lists, req) if mode == "hybrid" else lists[mode]

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
                        vector = await self.query_vector(req.query, vector)
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
                    query_lexical = await self._query_lexical(req, mode)
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

    async def _graph_linked_docs(
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

    async def _graph_boost(
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
        return self._fuse({**lists, "graph": graph_list}, req, extra={"graph": weight})

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
            vectors = await self.query_models.vectors(query, vector)
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

    async def query_vector(
        self, query: str, given: list[float] | None = None
    ) -> list[float] | None:
        """The query's embedding (``given`` when the caller has it), as a list of floats."""
        if given is not None:
            return given
        with stage("embed"):
            return _as_list((await self.embed_queries([query]))[0])

    async def embed_queries(self, queries: list[str]) -> Any:
        """Query embeddings within ``search.embed_deadline_s``. From an embedder that makes
        learned sparse weights too, those are remembered for the searches that follow.

        Raises:
            BackendUnavailable: the embedder failed or did not answer in time.
        """
        deadline = self.settings.search.embed_deadline_s
        try:
            async with asyncio.timeout(deadline):
                if not self.lexical:
                    return await self.embedder.embed(queries, "query")
                encoded = await self.embedder.encode(queries, "query")
        except TimeoutError:
            raise BackendUnavailable(
                "embedder", f"no query embedding within {deadline:g} s"
            ) from None
        for query, weights in zip(queries, encoded.lexical or (), strict=False):
            self._lexical[query] = weights
            self._lexical.move_to_end(query)
        while len(self._lexical) > LEXICAL_MEMORY:
            self._lexical.popitem(last=False)
        return encoded.dense

    def _lexical_weight(self, req: SearchDocsRequest) -> float:
        if req.weights is not None and req.weights.lexical is not None:
            return req.weights.lexical
        return self.settings.search.lexical_weight

    async def _query_lexical(self, req: SearchDocsRequest, mode: str) -> dict[int, float] | None:
        """The query's learned sparse weights when a hybrid search fuses them (``None``:
        it does not); embedded again only when the vector came without them."""
        if not self.lexical or mode != "hybrid" or self._lexical_weight(req) <= 0:
            return None
        weights = self._lexical.get(req.query)
        if weights is None:
            with stage("embed"):
                await self.embed_queries([req.query])
            weights = self._lexical.get(req.query)
        return weights or None

    def _fuse(
        self,
        lists: dict[str, list[SearchHit]],
        req: SearchDocsRequest,
        extra: dict[str, float] | None = None,
    ) -> Sequence[SearchHit]:
        """Hybrid fusion of ``lists`` (dense, BM25 and any ``extra`` weighted list).
        ``adaptive`` is weighted fusion whose dense/BM25 weights are set per query from the
        confidence of each method's candidate list (``ranking.adaptive_weights``)."""
        cfg = self.settings.search
        weights = (
            req.weights.model_dump(exclude={"lexical"})
            if req.weights is not None
            else {"dense": cfg.dense_weight, "bm25": cfg.bm25_weight}
        )
        if "lexical" in lists:
            weights["lexical"] = self._lexical_weight(req)
        fusion = req.fusion or cfg.fusion
        if fusion == "adaptive":
            methods = {m: lists[m] for m in weights if m in lists}
            weights = adaptive_weights(
                methods, weights, cfg.adaptive_gamma, cfg.adaptive_k, cfg.adaptive_measure
            )
        if fusion in ("weighted", "adaptive"):
            return fuse_weighted(lists, {**weights, **(extra or {})}, cfg.fusion_normalisation)
        # RRF is unweighted unless the caller sends weights (or an extra list comes in).
        if req.weights is None and not extra:
            return fuse_rrf(lists, cfg.rrf_k, None)
        base = weights if req.weights is not None else {m: 1.0 for m in lists if m != "graph"}
        return fuse_rrf(lists, cfg.rrf_k, {**base, **(extra or {})})

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


def _as_list(vector: Any) -> list[float] | None:
    if vector is None:
        return None
    return [float(x) for x in vector]


def _body(hit: SearchHit) -> str:
    return strip_header(hit.chunk)
