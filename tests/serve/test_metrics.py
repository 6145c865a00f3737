"""The gateway's Prometheus metrics, as Ray's metrics agent exports them (docs/operations.md,
"Metrics"): requests through the running app, then a scrape of the node's metrics export port
(``ray.nodes()`` names it, as Prometheus' service discovery file would)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.serve

Sample = tuple[str, dict[str, str], float]
# Metrics reach the agent on the workers' report interval (a few seconds), then the scrape.
EXPORT_TIMEOUT_S = 60


def metrics_url() -> str:
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert nodes and nodes[0]["MetricsExportPort"], nodes
    return f"http://{nodes[0]['NodeManagerAddress']}:{nodes[0]['MetricsExportPort']}/metrics"


def scrape(url: str) -> list[Sample]:
    text = httpx.get(url, timeout=10).text
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        if family.name.startswith("ray_rag_gateway_")
        for s in family.samples
    ]


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of ``name`` over every series matching ``labels``."""
    return sum(
        value
        for sample, found, value in samples
        if sample == name and all(found.get(k) == v for k, v in labels.items())
    )


def test_requests_reach_the_nodes_metrics_export_port(client: httpx.Client, api_key: str):
    team = f"dao_metrics_{uuid.uuid4().hex[:6]}"
    docs = [
        {
            "team_id": team,
            "doc_id": f"doc_{i}",
            "title": f"Metrics note {i}",
            "text": f"# Note {i}\n\nThe gateway exports Prometheus metrics through Ray Serve, "
            f"and Grafana shows them. Note number {i} about Milvus and Neo4j.",
        }
        for i in range(3)
    ]
    r = client.post("/ingest/documents", json={"documents": docs})
    assert r.status_code == 200 and r.json()["indexed"] == 3, r.text

    searches = 3
    for query in ("Prometheus metrics", "Grafana dashboard", "Prometheus metrics"):
        r = client.post("/rag/search_docs", json={"team_id": team, "query": query})
        assert r.status_code == 200, r.text
        assert r.json()["matches"]
    # A BM25-only search, and one through the second app, whose Reranker batches the rerank.
    r = client.post(
        "/rag/search_docs", json={"team_id": team, "query": "Neo4j", "search_mode": "bm25"}
    )
    assert r.status_code == 200 and r.json()["mode"] == "bm25", r.text
    body = {"team_id": team, "query": "Milvus", "rerank": True}
    r = client.post("/rr/rag/search_docs", json=body)
    assert r.status_code == 200 and not r.json()["degraded"], r.text
    # Refused: a key of another team (403 team_not_granted) and a token that does not verify.
    r = client.post(
        "/rag/search_docs",
        json={"team_id": team, "query": "Prometheus"},
        headers={"X-API-Key": api_key},
    )
    assert r.status_code == 403 and r.json()["reason"] == "team_not_granted", r.text
    r = client.post(
        "/rag/search_docs",
        json={"team_id": team, "query": "Prometheus"},
        headers={"authorization": "Bearer not-a-token"},
    )
    assert r.status_code == 401, r.text

    search_route = {"endpoint": "/rag/search_docs", "application": "rag"}
    expected: dict[str, Callable[[list[Sample]], bool]] = {
        "latency of the searches": lambda s: (
            total(s, "ray_rag_gateway_request_duration_seconds_count", status="2xx", **search_route)
            >= searches + 1
        ),
        "latency by search mode": lambda s: (
            total(s, "ray_rag_gateway_request_duration_seconds_count", mode="bm25", **search_route)
            >= 1
        ),
        "latency of the refused searches": lambda s: (
            total(
                s,
                "ray_rag_gateway_request_duration_seconds_count",
                status="4xx",
                mode="-",
                **search_route,
            )
            >= 2
        ),
        "latency of the ingest": lambda s: (
            total(
                s,
                "ray_rag_gateway_request_duration_seconds_count",
                endpoint="/ingest/documents",
                status="2xx",
            )
            >= 1
        ),
        "matches returned": lambda s: (
            total(s, "ray_rag_gateway_search_matches_count") >= searches + 2
        ),
        "403 denial": lambda s: (
            total(s, "ray_rag_gateway_denials_total", status="403", reason="team_not_granted") >= 1
        ),
        "401 denial": lambda s: total(s, "ray_rag_gateway_denials_total", status="401") >= 1,
        "cache lookups": lambda s: total(s, "ray_rag_gateway_cache_lookups_total") >= searches,
        "embedded tokens of the team": lambda s: (
            total(s, "ray_rag_gateway_embedded_tokens_total", team_id=team) > 0
        ),
        "embedder passage batches": lambda s: (
            total(
                s,
                "ray_rag_gateway_embedder_batch_size_count",
                kind="passage",
                deployment="Embedder",
            )
            >= 1
        ),
        "embedder queue wait": lambda s: (
            total(s, "ray_rag_gateway_embedder_queue_wait_seconds_count", kind="passage") >= 1
        ),
        "reranker batches": lambda s: (
            total(s, "ray_rag_gateway_reranker_batch_size_count", application="rag_rr") >= 1
        ),
        "audit records written": lambda s: (
            total(s, "ray_rag_gateway_audit_records_total", outcome="written") >= 1
        ),
    }
    url = metrics_url()
    deadline = time.monotonic() + EXPORT_TIMEOUT_S
    while True:
        samples = scrape(url)
        missing = [what for what, ok in expected.items() if not ok(samples)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    names = sorted({name for name, _, _ in samples})
    assert not missing, f"not exported within {EXPORT_TIMEOUT_S} s: {missing}; found {names}"

    # Every series carries the replica's Serve tags; no series names a team but the metering.
    for name, labels, _ in samples:
        assert {"deployment", "replica", "application"} <= set(labels), (name, labels)
        if name.startswith("ray_rag_gateway_embedded_tokens"):
            continue
        assert "team_id" not in labels and team not in labels.values(), (name, labels)
    # The tokens are the chunker's count of the chunk texts: a few dozen per short note.
    tokens = total(samples, "ray_rag_gateway_embedded_tokens_total", team_id=team)
    assert 3 * 10 <= tokens <= 3 * 200, tokens
