"""The faults ``bench.fault_run`` knows: for each one what a clear answer names, which
endpoint is probed and which kinds must answer normally again after the restore
(``FaultSpec``, ``SPECS``); the longest each endpoint may take by the README's deadlines
(``bounds``); and what counts as a clear or a normal answer (``is_clear``, ``is_normal``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bench.bench_load import Sample

ALL_FAULTS = ("milvus", "neo4j", "redis", "nats", "embedder")


@dataclass(frozen=True)
class FaultSpec:
    name: str
    # What a clear answer names (case-insensitive, in a 503's message or a degraded reason).
    names: str
    probe: str  # the kind probed every --probe-s
    # Kinds whose first normal answer after the restore counts as recovered.
    affected: tuple[str, ...]


SPECS = {
    "milvus": FaultSpec("milvus", r"milvus", "search", ("search", "enrich", "ingest")),
    "neo4j": FaultSpec("neo4j", r"neo4j|graph", "graph", ("graph", "path")),
    "redis": FaultSpec("redis", r"redis|cache", "search", ("search",)),
    # The bus is probed by publishing (FaultScenarios.nats_outage); the HTTP probe is a search.
    "nats": FaultSpec("nats", r"nats", "search", ()),
    "embedder": FaultSpec("embedder", r"embed", "ingest", ("ingest",)),
}


def bounds(settings: Any) -> dict[str, float]:
    """The longest each endpoint may take by the README's deadlines (+2 s for the 2-core
    client and proxy): a search sums its embed, graph and store deadlines (and rerank), the
    graph tools Neo4j's deadline, an ingest Serve's request timeout and a graph write."""
    s = settings.search
    query = s.embed_deadline_s + s.graph_deadline_s + s.store_deadline_s + 2.0
    if settings.reranker.enabled:
        query += s.rerank_deadline_s
    graph = settings.neo4j.deadline_s + 2.0
    return {"search": query, "enrich": query, "graph": graph, "path": graph, "ingest": 130.0}


def is_clear(sample: Sample, spec: FaultSpec) -> bool:
    pattern = re.compile(spec.names, re.IGNORECASE)
    if sample.status == 503 and pattern.search(sample.error):
        return True
    if sample.ok and any(pattern.search(r) for r in sample.degraded):
        return True
    return spec.name == "redis" and sample.ok and sample.cache.startswith("unavailable")


def is_normal(sample: Sample, spec: FaultSpec) -> bool:
    if not sample.normal:
        return False
    # With the cache on, a cached answer proves nothing about Milvus.
    return not (spec.name == "milvus" and sample.kind == "search" and sample.cache == "hit")
