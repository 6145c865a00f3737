"""Bulk "filler" chunks written straight into Milvus, for latency benchmarks at sizes the
2-core machine cannot embed in reasonable time (200k chunks would take ~5 h at ~12 chunks/s).

The rows are real chunks of synthetic documents (same chunker, ids, hashes and metadata as
ingestion, so BM25 indexes real text), but their dense vectors are random unit vectors, tagged
``embed_model = "bench-filler@random"``. Search latency depends on how many rows a search
scans, not on what the vectors mean; results that need meaningful vectors (quality) never use
filler. Benchmarks say which rows were filler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from batch_ingest.chunks import ChunkBuilder
from batch_ingest.chunks import chunk_builder as gateway_chunk_builder
from batch_ingest.documents import SourceDocument
from bench.common import Progress
from deployments.protocols import ChunkRecord
from serve_app.settings import GatewaySettings

logger = logging.getLogger("bench.filler")

FILLER_MODEL = "bench-filler@random"


def chunk_builder(settings: GatewaySettings) -> ChunkBuilder:
    """The gateway's chunker (its settings and tokenizer), tagging chunks ``FILLER_MODEL``."""
    return gateway_chunk_builder(settings.chunking, settings.embedder, FILLER_MODEL)


def filler_batches(
    docs: list[dict[str, Any]], settings: GatewaySettings, dim: int, *, seed: int, batch: int
) -> Iterator[list[ChunkRecord]]:
    """Chunks of ``docs`` with random unit vectors, ``batch`` chunks at a time."""
    builder = chunk_builder(settings)
    rng = np.random.default_rng(seed)
    pending: list[ChunkRecord] = []
    for raw in docs:
        pending += builder.build_chunks(SourceDocument.model_validate(raw))
        if len(pending) >= batch:
            yield _with_random_vectors(pending[:batch], rng, dim)
            pending = pending[batch:]
    if pending:
        yield _with_random_vectors(pending, rng, dim)


def _with_random_vectors(
    chunks: list[ChunkRecord], rng: np.random.Generator, dim: int
) -> list[ChunkRecord]:
    vectors = rng.standard_normal((len(chunks), dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [replace(c, vector=v.tolist()) for c, v in zip(chunks, vectors, strict=True)]


def insert_filler(
    store: Any,
    docs: list[dict[str, Any]],
    settings: GatewaySettings,
    dim: int,
    *,
    seed: int = 0,
    batch: int = 1000,
) -> dict[str, Any]:
    """Upsert the filler chunks of ``docs`` through ``store`` (a started ``MilvusStore``),
    logging progress; return counts and timing."""
    progress = Progress("filler upsert", len(docs), "docs", every_s=15.0)
    chunks = 0
    # Chunking here overlaps with the server's work on the previous upserts (at most two in
    # flight): the Milvus server is another process, and gRPC waits release the GIL.
    in_flight: list[Future] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for group in filler_batches(docs, settings, dim, seed=seed, batch=batch):
            if len(in_flight) >= 2:
                in_flight.pop(0).result()
            in_flight.append(pool.submit(store.upsert, group))
            chunks += len(group)
            progress.add(len({(c.team_id, c.doc_id) for c in group}))
        for future in in_flight:
            future.result()
    progress.log()
    return {"docs": len(docs), "chunks": chunks, "wall_s": round(progress.elapsed, 1)}
