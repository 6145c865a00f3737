"""Milvus's own fusion of a dense and a BM25 search (``hybrid_search`` with ``RRFRanker``):
the baseline the benchmarks and the store's integration tests hold the gateway's fusion
(serve_app/search/ranking.py) against. No gateway path calls it."""

from __future__ import annotations

from deployments.errors import InvalidInput
from deployments.protocols import SearchFilter, SearchHit
from deployments.vector_store.client import import_pymilvus
from deployments.vector_store.filter import build_filter_expr
from deployments.vector_store.rows import output_fields
from deployments.vector_store.search import BM25_PARAMS, dense_params, hits_of
from deployments.vector_store.store import MilvusStore


def hybrid_search(
    store: MilvusStore,
    query_text: str,
    query_vector: list[float],
    flt: SearchFilter,
    limit: int,
    rrf_k: int = 60,
) -> list[SearchHit]:
    """Top ``limit`` chunks inside ``flt`` by Milvus's RRF over both searches."""
    import_pymilvus()
    from pymilvus import AnnSearchRequest, RRFRanker

    name = store.teams.open(flt.team_id)
    if name is None:
        return []
    acl = store.shapes.has_acl(name)
    expr = build_filter_expr(flt, acl=acl)
    requests = [
        AnnSearchRequest(
            [query_vector], "dense", dense_params(store.settings, limit), limit, expr=expr
        ),
        AnnSearchRequest([query_text], "sparse", BM25_PARAMS, limit, expr=expr),
    ]
    result = store.conn.call(
        "hybrid search",
        "hybrid_search",
        name,
        requests,
        RRFRanker(rrf_k),
        limit=limit,
        output_fields=output_fields(acl=acl),
    )
    return hits_of(result, "hybrid")


def search_by_mode(
    store: MilvusStore,
    query_text: str,
    query_vector: list[float] | None,
    flt: SearchFilter,
    limit: int,
    mode: str,
    rrf_k: int = 60,
) -> list[SearchHit]:
    """``dense`` or ``bm25`` from the store, ``hybrid`` from Milvus's fusion above (the
    benchmarks and the store's tests name all three alike)."""
    if mode != "hybrid":
        return store.search(query_text, query_vector, flt, limit, mode)
    if query_vector is None:
        raise InvalidInput("mode 'hybrid' needs a query vector")
    return hybrid_search(store, query_text, query_vector, flt, limit, rrf_k)
