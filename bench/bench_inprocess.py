"""A search's steps in one process, on the chunks and queries of ``bench_plumbing``
(issue 37, bench/README.md "Search plumbing, eighth pass"):

1. ``memo``: near-duplicates and snippets of each query's fused list, derived afresh,
   with a ``PassageMemo`` warming up through the run, and with a memo of capacity 0;
   every variant's answers are checked against the fresh one.
2. ``embed``: the query embedding's p50 with different work between two embeddings —
   nothing, an idle gap like a c=1 client's round trip (``--gap-ms``), the dense scan +
   BM25, a whole search (fusion, near-duplicates, snippets, the response's JSON), and a
   whole search plus the gap.
3. ``halfscan``: the dense scan's product in float32 against bfloat16 / float16 (torch),
   warm and after other memory was read.
4. ``int8``: the memory index's int8 first pass against its float32 scan on the same rows:
   answers compared, rows rescored, the dense search's and the next embedding's p50.
5. ``overlap``: the query's embedding and the memory index's BM25 one after the other, and
   BM25 on the calling thread while the embedding runs in a worker thread (as an Ingress
   could at c=1, with the product's one model thread and the int8 first pass), then dense.
6. ``app``: the gateway's whole FastAPI app, requests straight into it (bench/inprocess_app.py):
   a search's p50, its ``Server-Timing`` stages, the time before and after the search service.
7. ``http``: the same app behind a plain uvicorn server, each benchmark client in a process of
   its own (bench/inprocess_http.py): the empty request, the search, the app, and the search's
   time outside the app — the HTTP legs without Ray Serve or HAProxy.

No Ray, no services: the chunks' vectors come from ``bench/results/cache`` (embedded on the
first run).

    .venv/bin/python -m bench.bench_inprocess [--what memo,embed] [--queries 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from batch_ingest.chunks import strip_header
from bench.bench_plumbing import corpus
from bench.common import setup_logging, write_result
from bench.inprocess_app import bench_app
from bench.inprocess_http import bench_http
from deployments.models.embedding import EmbedderCore
from deployments.protocols import SearchFilter, SearchHit
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.scan import DenseScan
from deployments.vector_store.memindex.team import TeamIndex
from serve_app.search.passages import PassageMemo
from serve_app.search.ranking import (
    adaptive_weights,
    drop_near_duplicates,
    fuse_weighted,
    shingles,
)
from serve_app.search.snippets import best_snippet, terms
from serve_app.settings import GatewaySettings


class Pipeline:
    """The in-memory index, the query model and the search settings of one run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.settings = GatewaySettings()
        _, chunks, queries = corpus(args, self.settings)
        self.chunks = chunks
        self.queries = [q for _, q in queries]
        self.index = TeamIndex(dim=len(chunks[0].vector), scan=DenseScan(2))
        self.index.upsert(chunks)
        self.core = EmbedderCore(self.settings.embedder)
        self.core.start()
        self.flt = compile_filter(SearchFilter(team_id=args.team))
        self.fetch = args.top_k * self.settings.search.candidate_multiplier
        self.top_k = args.top_k

    def embed(self, query: str) -> list[float]:
        return self.core.embed([query], "query")[0].tolist()

    def fused(self, query: str, vector: list[float]) -> list[SearchHit]:
        cfg = self.settings.search
        lists = {
            "dense": self.index.search("dense", self.flt, self.fetch, query_vector=vector),
            "bm25": self.index.search("bm25", self.flt, self.fetch, query_text=query),
        }
        base = {"dense": cfg.dense_weight, "bm25": cfg.bm25_weight}
        weights = adaptive_weights(
            lists, base, cfg.adaptive_gamma, cfg.adaptive_k, cfg.adaptive_measure
        )
        return fuse_weighted(lists, weights, cfg.fusion_normalisation)


def fresh(pipe: Pipeline, query: str, hits: list[SearchHit]) -> tuple[list[str], list[str]]:
    cfg = pipe.settings.search
    kept = drop_near_duplicates(
        hits, lambda h: shingles(strip_header(h.chunk)), cfg.near_duplicate_threshold, pipe.top_k
    )
    snips = [best_snippet(strip_header(h.chunk), query, cfg.snippet_chars) for h in kept]
    return [h.chunk.chunk_id for h in kept], snips


def memo_steps(pipe: Pipeline, memo: PassageMemo) -> Callable[..., tuple[list[str], list[str]]]:
    cfg = pipe.settings.search

    def run(query: str, hits: list[SearchHit]) -> tuple[list[str], list[str]]:
        kept = drop_near_duplicates(hits, memo.shingles, cfg.near_duplicate_threshold, pipe.top_k)
        wanted = terms(query)
        snips = [memo.of(h.chunk).snippet(wanted, cfg.snippet_chars) for h in kept]
        return [h.chunk.chunk_id for h in kept], snips

    return run


def bench_memo(pipe: Pipeline, rounds: int) -> dict[str, Any]:
    """p50 ms of near-duplicates + snippets per variant, and the memo's hit share."""
    fused = [(q, pipe.fused(q, pipe.embed(q))) for q in pipe.queries]
    out: dict[str, Any] = {}
    for _ in range(rounds):
        for name, capacity in (("fresh", None), ("memo", 2048), ("memo_capacity_0", 0)):
            memo = PassageMemo(capacity or 0)
            steps = memo_steps(pipe, memo) if capacity is not None else None
            took = []
            for query, hits in fused:
                started = time.perf_counter()
                got = steps(query, hits) if steps else fresh(pipe, query, hits)
                took.append((time.perf_counter() - started) * 1000)
                if steps and got != fresh(pipe, query, hits):
                    raise AssertionError(f"{name} answered {query!r} differently")
            row = out.setdefault(name, {"p50_ms": []})
            row["p50_ms"].append(round(statistics.median(took), 3))
            if capacity:
                row["hit_share"] = round(memo.hits / max(memo.hits + memo.misses, 1), 3)
    return out


def bench_embed(pipe: Pipeline, rounds: int, gap_s: float) -> dict[str, list[float]]:
    """The embedding's p50 ms with each kind of work between two embeddings."""
    memo = PassageMemo(2048)
    steps = memo_steps(pipe, memo)

    def between(kind: str, query: str, vector: list[float]) -> None:
        if kind == "nothing":
            return
        if kind == "gap":
            time.sleep(gap_s)
            return
        if kind == "scan":
            pipe.index.search("dense", pipe.flt, pipe.fetch, query_vector=vector)
            pipe.index.search("bm25", pipe.flt, pipe.fetch, query_text=query)
            return
        ids, snips = steps(query, pipe.fused(query, vector))
        body = json.dumps(
            {"matches": [{"chunk_id": i, "snippet": s} for i, s in zip(ids, snips, strict=True)]}
        )
        json.loads(body)
        if kind == "search+gap":
            time.sleep(gap_s)

    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        for kind in ("nothing", "gap", "scan", "search", "search+gap"):
            took = []
            for query in pipe.queries:
                started = time.perf_counter()
                vector = pipe.embed(query)
                took.append((time.perf_counter() - started) * 1000)
                between(kind, query, vector)
            out.setdefault(kind, []).append(round(statistics.median(took[20:]), 3))
    return out


def bench_overlap(pipe: Pipeline, rounds: int, gap_s: float) -> dict[str, Any]:
    """Per query, interleaved: each step alone; the embedding, then dense + BM25 in one
    call (the gateway today); the embedding in a worker thread while BM25 runs here, then
    dense. The model with one thread and the scan with the int8 first pass, as in the
    Ingress (run with ``OMP_NUM_THREADS=1``, as its replica is)."""
    core = EmbedderCore(pipe.settings.embedder.model_copy(update={"torch_threads": 1}))
    core.start()
    scan = DenseScan(2, None, True)
    index = TeamIndex(dim=pipe.index.dim, scan=scan)
    index.upsert(pipe.chunks)
    index.prepare_scan()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-embed")
    flt, fetch = pipe.flt, pipe.fetch

    def embed(query: str) -> list[float]:
        return core.embed([query], "query")[0].tolist()

    def sequential(query: str) -> None:
        vector = embed(query)
        index.search_methods(("dense", "bm25"), flt, fetch, query_text=query, query_vector=vector)

    def overlapped(query: str) -> None:
        future = pool.submit(embed, query)
        index.search("bm25", flt, fetch, query_text=query)
        index.search("dense", flt, fetch, query_vector=future.result())

    steps: dict[str, Callable[[str], Any]] = {
        "embed": embed,
        "bm25": lambda q: index.search("bm25", flt, fetch, query_text=q),
        "sequential": sequential,
        "overlapped": overlapped,
    }
    out: dict[str, Any] = {"int8_first_pass": scan.int8}
    for _ in range(rounds):
        took: dict[str, list[float]] = {k: [] for k in steps}
        for query in pipe.queries:
            for kind, step in steps.items():
                started = time.perf_counter()
                step(query)
                took[kind].append((time.perf_counter() - started) * 1000)
                time.sleep(gap_s)
        for kind, values in took.items():
            out.setdefault(kind, []).append(round(statistics.median(values[20:]), 3))
    pool.shutdown()
    return out


def bench_half_scan(pipe: Pipeline, rounds: int) -> dict[str, Any]:
    """The dense scan's product in float32 (NumPy, what the index does) against bfloat16 and
    float16 (torch, one thread) on the index's vectors, warm and after 64 MB of other memory
    was read (what a request's other steps leave), and the half types' largest error."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    f32 = np.asarray([c.vector for c in pipe.chunks], dtype=np.float32)
    f32 /= np.linalg.norm(f32, axis=1, keepdims=True)
    half = {"bfloat16": torch.from_numpy(f32).bfloat16(), "float16": torch.from_numpy(f32).half()}
    other = np.ones(64 * 2**20 // 8)
    vectors = [np.asarray(pipe.embed(q), dtype=np.float32) for q in pipe.queries]

    def product(kind: str, q: np.ndarray) -> np.ndarray:
        if kind == "float32":
            return f32 @ q
        m = half[kind]
        return (m @ torch.from_numpy(q).to(m.dtype)).float().numpy()

    out: dict[str, Any] = {}
    for _ in range(rounds):
        for cold in (False, True):
            for kind in ("float32", "bfloat16", "float16"):
                took = []
                for q in vectors:
                    if cold:
                        other.sum()
                    started = time.perf_counter()
                    product(kind, q)
                    took.append((time.perf_counter() - started) * 1000)
                key = f"{kind}_{'cold' if cold else 'warm'}_p50_ms"
                out.setdefault(key, []).append(round(statistics.median(took[10:]), 3))
    for kind in ("bfloat16", "float16"):
        err = max(float(np.abs(product(kind, q) - f32 @ q).max()) for q in vectors[:50])
        out[f"{kind}_max_abs_error"] = round(err, 5)
    return out


def bench_int8(pipe: Pipeline, rounds: int) -> dict[str, Any]:
    """The memory index's int8 first pass against its float32 scan on the same rows, one
    thread each (a Ray replica's): the answers compared (chunks and order), the rows the
    first pass rescored, and the dense search's and the next embedding's p50 with BM25 and
    the embedding between searches."""
    import numpy as np
    import torch

    from deployments.vector_store.memindex.int8 import Int8Pass

    torch.set_num_threads(1)
    dim = len(pipe.chunks[0].vector)
    indexes = {
        "float32": TeamIndex(dim=dim, scan=DenseScan(1)),
        "int8": TeamIndex(dim=dim, scan=DenseScan(1, int8=True)),
    }
    for index in indexes.values():
        index.upsert(pipe.chunks)
        index.prepare_scan()
    vectors = [pipe.embed(q) for q in pipe.queries]
    differ = 0
    for vector in vectors:
        found = [
            [h.chunk.chunk_id for h in i.search("dense", pipe.flt, pipe.fetch, query_vector=vector)]
            for i in indexes.values()
        ]
        differ += found[0] != found[1]
    matrix = np.asarray([c.vector for c in pipe.chunks], dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    first = Int8Pass(dim, DenseScan(1, int8=True))
    everything = np.ones(len(matrix), dtype=bool)
    rescored = []
    for vector in vectors:
        query = np.asarray(vector, dtype=np.float32)
        got = first.top(matrix, len(matrix), query / np.linalg.norm(query), everything, pipe.fetch)
        rescored.append(0 if got is None else int(got[0].size))
    out: dict[str, Any] = {
        "answers_differing": differ,
        "rows_rescored": {
            "median": float(np.median(rescored)),
            "p90": float(np.percentile(rescored, 90)),
            "max": max(rescored),
        },
    }
    for _ in range(rounds):
        for name, index in indexes.items():
            search, embed = [], []
            for query in pipe.queries:
                started = time.perf_counter()
                vector = pipe.embed(query)
                scanned = time.perf_counter()
                index.search("dense", pipe.flt, pipe.fetch, query_vector=vector)
                done = time.perf_counter()
                index.search("bm25", pipe.flt, pipe.fetch, query_text=query)
                embed.append((scanned - started) * 1000)
                search.append((done - scanned) * 1000)
            row = out.setdefault(name, {"dense_p50_ms": [], "embed_p50_ms": []})
            row["dense_p50_ms"].append(round(statistics.median(search[20:]), 3))
            row["embed_p50_ms"].append(round(statistics.median(embed[20:]), 3))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--what", default="memo,embed", help="of memo,embed,halfscan,int8,overlap,app,http"
    )
    p.add_argument("--chunks", type=int, default=17_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--top-k", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--gap-ms", type=float, default=3.0)
    p.add_argument("--team", default="bench_inprocess")
    p.add_argument("--out", default=None, help="result file (default bench/results/...)")
    args = p.parse_args(argv)
    setup_logging()
    result: dict[str, Any] = {}
    if "app" in args.what:  # its own app over its own index and model
        result["app"] = bench_app(args)
    if "http" in args.what:  # the same app behind uvicorn
        result["http"] = bench_http(args)
    if set(args.what.split(",")) <= {"app", "http"}:
        return _written(args, result)
    pipe = Pipeline(args)
    if "memo" in args.what:
        result["memo"] = bench_memo(pipe, args.rounds)
    if "embed" in args.what:
        result["embed_between"] = bench_embed(pipe, args.rounds, args.gap_ms / 1000)
    if "halfscan" in args.what:
        result["half_scan"] = bench_half_scan(pipe, args.rounds)
    if "int8" in args.what:
        result["int8"] = bench_int8(pipe, args.rounds)
    if "overlap" in args.what:
        result["overlap"] = bench_overlap(pipe, args.rounds, args.gap_ms / 1000)
    return _written(args, result)


def _written(args: argparse.Namespace, result: dict[str, Any]) -> int:
    path = write_result("inprocess", {"args": vars(args), **result}, args.out)
    print(json.dumps(result, indent=2))
    print(f"written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
