"""The metrics' pure parts: label mapping (degraded reasons, denial reasons, cache results,
route templates), the no-op outside a Serve replica, and what the hooks record when a metric
is live (a fake in place of the Ray metric). tests/serve/test_metrics.py scrapes the real
export."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from batch_ingest.chunking import Chunker, whitespace_tokens
from batch_ingest.documents import SourceDocument
from batch_ingest.pipeline import IngestPipeline
from deployments import metrics as dm
from deployments.testing.fakes import FakeEmbedder, FakeVectorStore
from serve_app import metrics as sm


class Recorded:
    """Stands for a ray.serve.metrics metric: keeps what was recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, str] | None]] = []

    def inc(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.calls.append((value, tags))

    observe = inc


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch):
    """Make the given metrics live with a ``Recorded`` fake each."""

    def make(*metrics: dm._Metric) -> list[Recorded]:
        fakes = []
        for metric in metrics:
            fake = Recorded()
            monkeypatch.setattr(metric, "_metric", fake)
            fakes.append(fake)
        return fakes

    return make


# --- label mapping ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        # serve_app/search/retrieval.py
        (
            "embedder unavailable, fell back to BM25 only: embedder: no answer within 3 s",
            "embedder",
        ),
        (
            "embedder unavailable, fell back to BM25 only: milvus: connection refused",
            "embedder",
        ),
        ("reranker unavailable, fused order kept: reranker: no answer within 3 s", "reranker"),
        ("rerank requested but no reranker is configured", "reranker"),
        ("graph unavailable, searched without it: neo4j: no answer within 2 s", "graph"),
        # batch_ingest/pipeline.py
        ("graph not updated: ServiceUnavailable", "graph"),
        ("source registry not updated: OperationalError", "store"),
        ("index generation not raised (cached answers may lag; in-memory …): boom", "store"),
        ("milvus: collection not loaded", "store"),
        ("something else entirely", "other"),
        ("", "other"),
    ],
)
def test_degraded_reasons_map_to_a_few_classes(reason: str, expected: str):
    assert sm.degraded_class(reason) == expected
    assert expected in sm.DEGRADED_CLASSES


def test_degraded_classes_count_each_class_once():
    reasons = [
        "graph unavailable, searched without it: neo4j: down",
        "embedder unavailable, fell back to BM25 only: timeout",
        "graph not updated: down",
    ]
    assert sm.degraded_classes(reasons) == ["graph", "embedder"]
    assert sm.degraded_classes([]) == []


def test_label_values_are_bounded():
    assert sm.reason_code("team_not_granted") == "team_not_granted"
    assert sm.reason_code(None) == "unknown"
    assert sm.reason_code("Weird Reason: with {braces}" + "x" * 100) == (
        "weird_reason__with__braces_" + "x" * 21
    )
    assert sm.cache_result("unavailable: redis: timed out (retrying shortly)") == "unavailable"
    assert [sm.cache_result(s) for s in ("hit", "miss", "bypass")] == ["hit", "miss", "bypass"]
    assert [sm.status_class(s) for s in (200, 204, 403, 422, 503)] == [
        "2xx",
        "2xx",
        "4xx",
        "4xx",
        "5xx",
    ]


# --- no-ops outside Serve -------------------------------------------------------------------


def test_outside_a_serve_replica_nothing_is_created_or_recorded():
    assert dm.in_serve_replica() is False
    every = [
        sm.REQUEST_DURATION,
        sm.SEARCH_MATCHES,
        sm.DEGRADED,
        sm.DENIALS,
        sm.CACHE_LOOKUPS,
        sm.AUDIT_RECORDS,
        dm.EMBEDDER_BATCH_SIZE,
        dm.EMBEDDER_QUEUE_WAIT,
        dm.RERANKER_BATCH_SIZE,
        dm.EMBEDDED_TOKENS,
    ]
    for metric in every:
        assert metric.live is False
        assert metric.name.startswith("rag_gateway_")
    sm.record_search("hybrid", 3, ["graph unavailable"])
    sm.record_cache("hit")
    sm.record_denial(403, "team_not_granted")
    sm.record_audit("written", 2)
    dm.EMBEDDED_TOKENS.inc(10, team_id="dao_x")
    dm.EMBEDDER_BATCH_SIZE.observe(4, kind="passage")
    assert all(metric._metric is None for metric in every)


def test_a_replica_context_of_ray_serve_turns_them_on(monkeypatch: pytest.MonkeyPatch):
    fake = types.ModuleType("ray.serve.context")
    context: list[object | None] = [None]
    fake._get_internal_replica_context = lambda: context[0]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.serve.context", fake)
    assert dm.in_serve_replica() is False
    context[0] = object()
    assert dm.in_serve_replica() is True
    monkeypatch.setattr(dm, "ENABLED", False)  # METRICS__ENABLED=false
    assert dm.in_serve_replica() is False


def test_a_metric_that_cannot_be_made_stays_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(dm, "in_serve_replica", lambda: True)
    counter = dm.Counter("rag_gateway_test_broken", "test", ("a",))

    def broken() -> Any:
        raise RuntimeError("no Ray here")

    monkeypatch.setattr(counter, "_make", broken)
    counter.inc(1, a="b")  # logged, not raised
    assert counter.live is False and counter._metric is None


def test_recording_never_raises(live):
    class Raising:
        def inc(self, *args: Any, **kwargs: Any) -> None:
            raise ValueError("Missing value for tag key(s)")

        observe = inc

    counter = dm.Counter("rag_gateway_test_raising", "test", ("a",))
    counter._metric = Raising()
    counter.inc(1)
    histogram = dm.Histogram("rag_gateway_test_raising_h", "test", [1.0], ("a",))
    histogram._metric = Raising()
    histogram.observe(1)
    # Ray refuses a counter step ≤ 0: such a step records nothing.
    (fake,) = live(sm.AUDIT_RECORDS)
    sm.record_audit("written", 0)
    assert fake.calls == []


# --- what the hooks record ------------------------------------------------------------------


def app_with_metrics() -> FastAPI:
    app = FastAPI()
    app.add_middleware(sm.RequestMetrics)

    @app.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        if item_id == "secret":
            raise HTTPException(403)
        sm.note_search_mode("bm25")
        return {"id": item_id}

    return app


def test_request_latency_is_labelled_by_route_template_mode_and_status_class(live):
    (fake,) = live(sm.REQUEST_DURATION)
    with TestClient(app_with_metrics()) as client:
        assert client.get("/items/a1").status_code == 200
        assert client.get("/items/secret").status_code == 403
        assert client.get("/nowhere/42").status_code == 404
    tags = [t for _, t in fake.calls]
    assert tags == [
        {"endpoint": "/items/{item_id}", "mode": "bm25", "status": "2xx"},
        {"endpoint": "/items/{item_id}", "mode": "-", "status": "4xx"},
        {"endpoint": "unmatched", "mode": "-", "status": "4xx"},
    ]
    assert all(0 <= value < 10 for value, _ in fake.calls)


def test_the_middleware_passes_requests_through_when_off():
    assert sm.REQUEST_DURATION.live is False
    with TestClient(app_with_metrics()) as client:
        assert client.get("/items/a1").json() == {"id": "a1"}
    assert sm.REQUEST_DURATION._metric is None


def test_a_search_records_matches_and_each_degraded_class(live):
    matches, degraded = live(sm.SEARCH_MATCHES, sm.DEGRADED)
    sm.record_search(
        "bm25",
        0,
        [
            "embedder unavailable, fell back to BM25 only: x",
            "graph unavailable, searched without it: y",
        ],
    )
    assert matches.calls == [(0, {"mode": "bm25"})]
    assert degraded.calls == [(1.0, {"reason": "embedder"}), (1.0, {"reason": "graph"})]


def test_denials_and_cache_results_are_counted_by_code(live):
    denials, cache = live(sm.DENIALS, sm.CACHE_LOOKUPS)
    sm.record_denial(403, "team_not_granted")
    sm.record_denial(401, None)
    sm.record_cache("unavailable: redis down")
    assert denials.calls == [
        (1.0, {"status": "403", "reason": "team_not_granted"}),
        (1.0, {"status": "401", "reason": "unknown"}),
    ]
    assert cache.calls == [(1.0, {"result": "unavailable"})]


async def test_ingestion_meters_the_embedded_tokens_per_team(live):
    (tokens,) = live(dm.EMBEDDED_TOKENS)
    chunker = Chunker(whitespace_tokens, max_tokens=40, overlap_tokens=8)
    pipeline = IngestPipeline(
        embedder=FakeEmbedder(dim=8),
        store=FakeVectorStore(),
        graph=None,
        chunker=chunker,
        embed_model="fake@v1",
    )
    docs = [
        SourceDocument.model_validate(
            {"team_id": team, "doc_id": f"d_{team}", "title": "T", "text": text}
        )
        for team, text in (("dao_a", "one two three four"), ("dao_b", "five six"))
    ]
    expected = {
        d.team_id: sum(whitespace_tokens(c.text) for c in pipeline.build_chunks(d)) for d in docs
    }
    await pipeline.ingest(docs)
    assert {tags["team_id"]: value for value, tags in tokens.calls if tags} == expected
    # Unchanged documents are not embedded again, so not metered again.
    await pipeline.ingest(docs)
    assert len(tokens.calls) == 2


def test_the_dashboard_queries_only_metrics_the_gateway_exports():
    """deploy/grafana/rag-gateway.json names each metric as Ray exports it: ``ray_`` + name,
    ``_total`` for a counter, ``_bucket``/``_count``/``_sum`` for a histogram."""
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "rag-gateway.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"ray_rag_gateway_\w+", e)}
    ours = [m for module in (sm, dm) for m in vars(module).values() if isinstance(m, dm._Metric)]
    exported = {f"ray_{m.name}_total" for m in ours if isinstance(m, dm.Counter)} | {
        f"ray_{m.name}_{part}"
        for m in ours
        if isinstance(m, dm.Histogram)
        for part in ("bucket", "count", "sum")
    }
    assert used and used <= exported, used - exported
    # Every metric has a panel.
    assert {f"ray_{m.name}" for m in ours} <= {
        re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used
    }
