"""A hybrid search's fusion as the request and ``search.*`` choose it: weighted, adaptive
(weights set per query from each method's candidates) or RRF, over dense, BM25, the learned
sparse list and any extra weighted list (the graph's)."""

from __future__ import annotations

from collections.abc import Sequence

from deployments.protocols import SearchHit
from serve_app.search.contracts import SearchDocsRequest
from serve_app.search.query_vectors import lexical_weight
from serve_app.search.ranking import adaptive_weights, fuse_rrf, fuse_weighted
from serve_app.settings import GatewaySettings


def fuse(
    lists: dict[str, list[SearchHit]],
    req: SearchDocsRequest,
    settings: GatewaySettings,
    extra: dict[str, float] | None = None,
) -> Sequence[SearchHit]:
    """Hybrid fusion of ``lists`` (dense, BM25 and any ``extra`` weighted list).
    ``adaptive`` is weighted fusion whose dense/BM25 weights are set per query from the
    confidence of each method's candidate list (``ranking.adaptive_weights``)."""
    cfg = settings.search
    weights = (
        req.weights.model_dump(exclude={"lexical"})
        if req.weights is not None
        else {"dense": cfg.dense_weight, "bm25": cfg.bm25_weight}
    )
    if "lexical" in lists:
        weights["lexical"] = lexical_weight(req, settings)
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
