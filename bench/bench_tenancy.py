"""Does a tenant's search latency grow with other tenants' data? (issue 3, tenant isolation)

1. Starts the gateway (``bench.serve_harness``) with the Milvus ``--layout`` under test and
   ingests ``--tenant-docs`` (2,000) synthetic documents of tenant A through
   ``POST /ingest/documents`` (real embeddings); flushes.
2. "alone": ``--requests`` searches of tenant A at each ``--concurrency`` level, plus the
   in-process baseline (query embedding + one ``MilvusStore.search``) of ``bench_search``.
3. Writes ``--other-docs`` (200,000) chunks of ``--other-tenants`` (20) other tenants straight
   into Milvus (``bench/filler.py``: real chunk text for BM25, random unit vectors); flushes.
4. "with others": the same searches again (same queries, same order).

Prints both phases and the ratio of tenant A's p50 with the others present to its p50 alone.

    .venv/bin/python -m bench.bench_tenancy                           # per-team collections
    .venv/bin/python -m bench.bench_tenancy --layout shared           # one shared collection
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

import httpx

from bench.bench_search import baseline, search_level
from bench.common import (
    DEFAULT_PORT,
    Progress,
    environment_info,
    http_ingest,
    markdown_table,
    parse_int_list,
    setup_logging,
)
from bench.corpus import generate_corpus, make_queries
from bench.serve_harness import ServeHarness, run_benchmark

logger = logging.getLogger("bench.tenancy")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tenancy",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="Serve HTTP port")
    p.add_argument(
        "--collection", default="bench_tenancy", help="Milvus base name (must start bench_)"
    )
    p.add_argument(
        "--layout",
        choices=("collection_per_team", "shared"),
        default=None,
        help="Milvus layout (default: the app's default)",
    )
    p.add_argument("--tenant-docs", type=int, default=2000, help="tenant A's documents (API)")
    p.add_argument("--other-docs", type=int, default=200_000, help="other tenants' chunks")
    p.add_argument("--other-tenants", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ingest-batch", type=int, default=32)
    p.add_argument("--ingest-concurrency", type=int, default=2)
    p.add_argument("--concurrency", type=parse_int_list, default="1,8")
    p.add_argument("--requests", type=int, default=200, help="searches per level and phase")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--mode", choices=("hybrid", "dense", "bm25"), default=None)
    p.add_argument("--visibility", choices=("public", "confidential"), default="public")
    p.add_argument("--baseline-requests", type=int, default=50)
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--out", default=None, help="result JSON (default bench/results/tenancy-*)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def tenant_prefix(args: argparse.Namespace) -> str:
    # bench_search.baseline() draws its queries from f"{collection}_t" with args.tenants.
    return f"{args.collection}_t"


async def measure(args: argparse.Namespace, h: ServeHarness, store: Any) -> dict[str, Any]:
    """Tenant A's search latency at each concurrency level, then the in-process baseline."""
    out: dict[str, Any] = {"search": []}
    limits = httpx.Limits(max_connections=max(args.concurrency) + 2)
    async with httpx.AsyncClient(base_url=h.base_url, timeout=120.0, limits=limits) as client:
        warm = make_queries(args.warmup, 1, args.seed + 1, tenant_prefix=tenant_prefix(args))
        await search_level(args, client, warm, 1)
        for level, concurrency in enumerate(args.concurrency):
            queries = make_queries(
                args.requests, 1, args.seed + 100 + level, tenant_prefix=tenant_prefix(args)
            )
            res = await search_level(args, client, queries, concurrency)
            logger.info(
                "tenant A, concurrency %d: p50 %s ms, p95 %s ms, %d errors, %d foreign",
                concurrency,
                res["latency"].get("p50_ms"),
                res["latency"].get("p95_ms"),
                res["errors"],
                res["foreign_tenant"],
            )
            out["search"].append(res)
    modes = sorted({m for r in out["search"] for m in r["modes"]})
    out["baseline"] = await baseline(args, h, store, ["dense"] + [m for m in modes if m != "dense"])
    return out


async def run(args: argparse.Namespace, h: ServeHarness) -> dict[str, Any]:
    from bench.filler import insert_filler
    from deployments.models.embedding import embedding_dim

    result: dict[str, Any] = {}
    docs = generate_corpus(args.tenant_docs, 1, args.seed, tenant_prefix=tenant_prefix(args))
    progress = Progress("ingest tenant A", len(docs), "documents", every_s=15.0)
    ingest = await http_ingest(
        h.base_url,
        docs,
        batch_size=args.ingest_batch,
        concurrency=args.ingest_concurrency,
        progress=progress,
    )
    result["ingest"] = ingest
    if ingest["errors"] or ingest["failed"]:
        raise RuntimeError(f"ingestion was not clean: {ingest}")
    team_a = docs[0]["team_id"]
    store = h.milvus_store()
    try:
        await asyncio.to_thread(store.start)
        await asyncio.to_thread(store.flush)
        result["tenant_rows"] = await asyncio.to_thread(store.count, team_a)
        logger.info("tenant %s holds %d chunks; measuring alone", team_a, result["tenant_rows"])
        result["alone"] = await measure(args, h, store)

        others = generate_corpus(
            args.other_docs,
            args.other_tenants,
            args.seed + 1,
            tenant_prefix=f"{args.collection}_o",
            doc_prefix="other",
        )
        result["filler"] = await asyncio.to_thread(
            insert_filler,
            store,
            others,
            h.settings,
            embedding_dim(h.settings.embedder),
            seed=args.seed,
        )
        t0 = time.perf_counter()
        await asyncio.to_thread(store.flush)
        result["flush_s"] = round(time.perf_counter() - t0, 1)
        result["total_rows"] = await asyncio.to_thread(store.owned.count_rows)
        result["collections"] = len((await asyncio.to_thread(store.owned.names))[1])
        logger.info(
            "%d rows in %d collection(s) (flush %.1fs); measuring tenant A again",
            result["total_rows"],
            result["collections"],
            result["flush_s"],
        )
        result["with_others"] = await measure(args, h, store)
    finally:
        store.close()
    return result


def render(result: dict[str, Any]) -> str:
    rows = []
    alone, crowded = result.get("alone", {}), result.get("with_others", {})
    for before, after in zip(alone.get("search", []), crowded.get("search", []), strict=False):
        b, a = before["latency"], after["latency"]
        rows.append(
            [
                f"gateway POST /rag/search_docs ({'/'.join(before['modes'])})",
                before["concurrency"],
                b.get("p50_ms"),
                b.get("p95_ms"),
                a.get("p50_ms"),
                a.get("p95_ms"),
                f"{a['p50_ms'] / b['p50_ms']:.2f}×" if b.get("p50_ms") else "–",
                before["errors"] + after["errors"],
                before["foreign_tenant"] + after["foreign_tenant"],
            ]
        )
    for mode in ("dense", "hybrid", "bm25"):
        b, a = alone.get("baseline", {}).get(mode), crowded.get("baseline", {}).get(mode)
        if not b or not a:
            continue
        for part in ("total", "milvus"):
            label = (
                "baseline: embedding + MilvusStore.search"
                if part == "total"
                else ("  of which: Milvus search")
            )
            bp, ap = b[part]["p50_ms"], a[part]["p50_ms"]
            rows.append(
                [
                    f"{label} ({mode})",
                    1,
                    bp,
                    b[part]["p95_ms"],
                    ap,
                    a[part]["p95_ms"],
                    f"{ap / bp:.2f}×",
                    0,
                    "–",
                ]
            )
    return markdown_table(
        [
            "path",
            "concurrency",
            "alone p50 ms",
            "alone p95 ms",
            "with others p50 ms",
            "with others p95 ms",
            "p50 ratio",
            "errors",
            "foreign matches",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.tenants = 1  # bench_search.baseline() queries tenant A only
    setup_logging(args.verbose)
    settings: dict[str, Any] = {}
    if args.layout:
        settings["milvus"] = {"layout": args.layout}
    harness = ServeHarness(
        port=args.port,
        collection=args.collection,
        tenant_prefix=tenant_prefix(args),
        graph_enabled=True,
        ready_timeout_s=args.ready_timeout,
        settings=settings,
    )
    result: dict[str, Any] = {
        "benchmark": "tenancy",
        "args": {k: v for k, v in vars(args).items() if k != "verbose"},
        "environment": environment_info(),
        "layout": harness.settings.milvus.layout,
    }
    run_benchmark("tenancy", harness, result, lambda h: run(args, h), render, args.out)
    print(f"\nlayout {result['layout']}\n\n{result['table_markdown']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
