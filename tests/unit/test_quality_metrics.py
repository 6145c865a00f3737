"""The evaluation harness's metrics (bench/quality/metrics.py)."""

from __future__ import annotations

import pytest

from bench.quality.metrics import ndcg_at_k, paired_bootstrap, per_query_ndcg


def test_ndcg_counts_a_document_at_its_rank() -> None:
    assert ndcg_at_k(["a", "b"], {"a": 1}) == 1.0
    assert ndcg_at_k(["b", "a"], {"a": 1}) == pytest.approx(1 / 1.5849625)
    assert ndcg_at_k(["b", "c"], {"a": 1}) == 0.0


def test_paired_bootstrap_interval_brackets_the_mean_and_excludes_zero_for_a_clear_gain() -> None:
    qrels = {f"q{i}": {"rel": 1} for i in range(200)}
    better = {q: ["rel"] for q in qrels}
    # The worse run finds the document at rank 2 on every other query.
    worse = {q: (["x", "rel"] if i % 2 else ["rel"]) for i, q in enumerate(qrels)}
    a, b = per_query_ndcg(better, qrels), per_query_ndcg(worse, qrels)
    mean, lo, hi = paired_bootstrap(a, b, samples=2000)
    assert mean == pytest.approx((1 - 1 / 1.5849625) / 2)
    assert 0 < lo < mean < hi


def test_paired_bootstrap_of_identical_runs_is_zero() -> None:
    scores = {f"q{i}": i / 10 for i in range(10)}
    assert paired_bootstrap(scores, dict(scores), samples=500) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_interval_straddles_zero_for_noise() -> None:
    a = {f"q{i}": float(i % 2) for i in range(100)}
    b = {f"q{i}": float((i + 1) % 2) for i in range(100)}
    mean, lo, hi = paired_bootstrap(a, b, samples=2000)
    assert mean == 0.0 and lo < 0 < hi
