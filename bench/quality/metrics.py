"""nDCG@k, MRR@k and Recall@k over ranked document ids and graded qrels."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def distinct(ranked: Sequence[str]) -> list[str]:
    """Document ids in first-seen order: a document found by several of its chunks counts
    once, at the rank of its best chunk (metrics are per document)."""
    return list(dict.fromkeys(ranked))


def ndcg_at_k(ranked: Sequence[str], qrels: dict[str, int], k: int = 10) -> float:
    dcg = sum((2 ** qrels.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(qrels.values(), reverse=True)[:k]
    idcg = sum((2**g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def mrr_at_k(ranked: Sequence[str], qrels: dict[str, int], k: int = 10) -> float:
    for i, d in enumerate(ranked[:k]):
        if qrels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def recall_at_k(ranked: Sequence[str], qrels: dict[str, int], k: int = 10) -> float:
    relevant = {d for d, g in qrels.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant & set(ranked[:k])) / len(relevant)


def evaluate(
    runs: dict[str, list[str]], qrels: dict[str, dict[str, int]], k: int = 10
) -> dict[str, float]:
    """Mean of each metric over the queries in ``runs``."""
    n = len(runs) or 1
    return {
        f"ndcg@{k}": sum(ndcg_at_k(r, qrels[q], k) for q, r in runs.items()) / n,
        f"mrr@{k}": sum(mrr_at_k(r, qrels[q], k) for q, r in runs.items()) / n,
        f"recall@{k}": sum(recall_at_k(r, qrels[q], k) for q, r in runs.items()) / n,
    }


def per_query_ndcg(
    runs: dict[str, list[str]], qrels: dict[str, dict[str, int]], k: int = 10
) -> dict[str, float]:
    return {q: ndcg_at_k(r, qrels[q], k) for q, r in runs.items()}


def paired_bootstrap(
    a: dict[str, float], b: dict[str, float], samples: int = 10_000, seed: int = 7
) -> tuple[float, float, float]:
    """Mean of ``a − b`` over the queries both score, with a 95 % percentile interval from
    resampling those queries with replacement (the paired bootstrap of IR evaluation)."""
    queries = sorted(set(a) & set(b))
    if not queries:
        return 0.0, 0.0, 0.0
    diffs = [a[q] - b[q] for q in queries]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    return sum(diffs) / n, means[int(0.025 * samples)], means[int(0.975 * samples) - 1]
