"""Search latency of POST /rag/search_docs over an ingested synthetic corpus, with a baseline.

1. Starts the gateway (``bench.serve_harness``) on its own collection and ingests ``--docs``
   synthetic documents (one chunk each with the defaults) across ``--tenants`` tenants through
   ``POST /ingest/documents``, logging progress with rate and ETA; then flushes Milvus.
2. Sends ``--requests`` search requests per concurrency level (closed loop, queries of 2–4
   words from the corpus vocabulary, a random tenant each) and reports client-side latency
   p50/p95/p99, the server's own ``took_ms`` and throughput.
3. Baseline in the same run: one query embedding through the Embedder handle plus one
   in-process ``MilvusStore.search`` (dense mode, same filter and candidate count as the
   gateway), sequentially; medians of each part and of the sum. When the gateway searches in
   another mode (hybrid by default) that mode gets a baseline row too.

    .venv/bin/python -m bench.bench_search --help
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from typing import Any

import httpx

from bench.common import (
    DEFAULT_PORT,
    Progress,
    closed_loop,
    environment_info,
    http_ingest,
    latency_summary,
    markdown_table,
    parse_int_list,
    setup_logging,
)
from bench.corpus import generate_corpus, make_queries
from bench.serve_harness import ServeHarness, run_benchmark
from deployments.vector_store.baseline import search_by_mode

logger = logging.getLogger("bench.search")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_search",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="Serve HTTP port")
    p.add_argument(
        "--collection", default="bench_search", help="Milvus collection (must start bench_)"
    )
    p.add_argument("--docs", type=int, default=5000, help="documents in the corpus")
    p.add_argument(
        "--api-docs",
        type=int,
        default=None,
        help="ingest only the first N documents through the API (real embeddings); the rest "
        "are written straight into Milvus as filler with random vectors (bench/filler.py). "
        "Default: all through the API",
    )
    p.add_argument("--tenants", type=int, default=10, help="tenants (team_id) of the corpus")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-words", type=int, default=100)
    p.add_argument("--max-words", type=int, default=140)
    p.add_argument("--ingest-batch", type=int, default=32, help="documents per ingest request")
    p.add_argument("--ingest-concurrency", type=int, default=2, help="concurrent ingest requests")
    p.add_argument(
        "--concurrency",
        type=parse_int_list,
        default="1,8",
        help="search concurrency levels, comma-separated",
    )
    p.add_argument("--requests", type=int, default=200, help="search requests per level")
    p.add_argument("--warmup", type=int, default=10, help="unmeasured searches before the first")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument(
        "--mode",
        choices=("hybrid", "dense", "bm25"),
        default=None,
        help="search_mode sent to the gateway (default: omitted, the app's default)",
    )
    p.add_argument(
        "--visibility",
        choices=("public", "confidential"),
        default="public",
        help="the caller's privacy mode in every search",
    )
    p.add_argument("--baseline-requests", type=int, default=50, help="sequential baseline queries")
    p.add_argument("--no-flush", action="store_true", help="skip the Milvus flush after ingest")
    p.add_argument("--no-graph", action="store_true", help="deploy without the Graph (Neo4j)")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for /readyz")
    p.add_argument("--out", default=None, help="result JSON (default bench/results/search-*.json)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def search_body(args: argparse.Namespace, team_id: str, query: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "team_id": team_id,
        "query": query,
        "top_k": args.top_k,
        "visibility": args.visibility,
    }
    if args.mode:
        body["search_mode"] = args.mode
    return body


async def search_level(
    args: argparse.Namespace,
    client: httpx.AsyncClient,
    queries: list[tuple[str, str]],
    concurrency: int,
) -> dict[str, Any]:
    server_ms: list[float] = []
    modes: set[str] = set()
    stats = {"empty": 0, "foreign_tenant": 0, "degraded": 0}

    async def call(item: tuple[str, str]) -> int:
        team_id, query = item
        resp = await client.post("/rag/search_docs", json=search_body(args, team_id, query))
        if resp.status_code != 200:
            raise RuntimeError(f"search answered {resp.status_code}: {resp.text[:300]}")
        body = resp.json()
        server_ms.append(float(body["took_ms"]))
        modes.add(body["mode"])
        matches = body["matches"]
        stats["empty"] += not matches
        stats["degraded"] += bool(body.get("degraded"))
        stats["foreign_tenant"] += sum(m["source_ref"]["team_id"] != team_id for m in matches)
        return len(matches)

    wall, latencies, _, errors = await closed_loop(queries, concurrency, call)
    for exc in errors[:3]:
        logger.error("search failed: %s", exc)
    return {
        "concurrency": concurrency,
        "requests": len(queries),
        "errors": len(errors),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(latencies) / wall, 2) if wall > 0 else None,
        "latency": latency_summary(latencies),
        "server_took": latency_summary([ms / 1000.0 for ms in server_ms]),
        "modes": sorted(modes),
        **stats,
    }


async def baseline(
    args: argparse.Namespace, h: ServeHarness, store: Any, modes: list[str]
) -> dict[str, Any]:
    """Query embedding via the Embedder handle + in-process MilvusStore.search, sequential."""
    from serve_app.access.context import AccessContext
    from serve_app.access.policy import Policy
    from serve_app.auth.principal import Principal
    from serve_app.search.contracts import SearchDocsRequest

    settings = h.settings
    limit = args.top_k * settings.search.candidate_multiplier
    handle = h.embedder_handle()
    queries = make_queries(
        args.baseline_requests, args.tenants, args.seed + 7919, tenant_prefix=tenant_prefix(args)
    )

    def search_filter(team_id: str, query: str):
        req = SearchDocsRequest.model_validate(search_body(args, team_id, query))
        # The benchmark's own body trust: the team's owner under the built-in policy.
        owner = Principal.development(("owner",))
        ctx = AccessContext.for_caller(
            owner,
            Policy(),
            team_id=req.team_id,
            user_id=req.user_id,
            agent_id=req.agent_id,
            visibility=req.visibility,
        )
        return ctx.search_filter(req.filters)

    out: dict[str, Any] = {"limit": limit, "requests": len(queries)}
    for mode in modes:
        embed_s, milvus_s, total_s, hits_n = [], [], [], []
        # Warm-up (connection, caches); not measured.
        for team_id, query in queries[:3]:
            vec = (await handle.embed.remote([query], "query"))[0] if mode != "bm25" else None
            search_by_mode(store, query, _as_list(vec), search_filter(team_id, query), limit, mode)
        for team_id, query in queries:
            flt = search_filter(team_id, query)
            t0 = time.perf_counter()
            vec = None
            if mode != "bm25":
                vec = (await handle.embed.remote([query], "query"))[0]
            t1 = time.perf_counter()
            hits = search_by_mode(
                store, query, _as_list(vec), flt, limit, mode, settings.search.rrf_k
            )
            t2 = time.perf_counter()
            embed_s.append(t1 - t0)
            milvus_s.append(t2 - t1)
            total_s.append(t2 - t0)
            hits_n.append(len(hits))
        out[mode] = {
            "embed": latency_summary(embed_s) if mode != "bm25" else None,
            "milvus": latency_summary(milvus_s),
            "total": latency_summary(total_s),
            "mean_hits": round(statistics.fmean(hits_n), 1) if hits_n else 0,
        }
        logger.info(
            "baseline %s: embed p50 %s ms + Milvus p50 %s ms = total p50 %s ms",
            mode,
            (out[mode]["embed"] or {}).get("p50_ms", 0),
            out[mode]["milvus"]["p50_ms"],
            out[mode]["total"]["p50_ms"],
        )
    return out


def _as_list(vec: Any) -> list[float] | None:
    return None if vec is None else [float(x) for x in vec]


def tenant_prefix(args: argparse.Namespace) -> str:
    return f"{args.collection}_t"


async def run(args: argparse.Namespace, h: ServeHarness) -> dict[str, Any]:
    result: dict[str, Any] = {}
    docs = generate_corpus(
        args.docs,
        args.tenants,
        args.seed,
        min_words=args.min_words,
        max_words=args.max_words,
        tenant_prefix=tenant_prefix(args),
    )
    n_api = len(docs) if args.api_docs is None else min(args.api_docs, len(docs))
    docs, filler_docs = docs[:n_api], docs[n_api:]
    logger.info(
        "ingesting %d documents (%d tenants) in requests of %d, %d concurrent",
        len(docs),
        args.tenants,
        args.ingest_batch,
        args.ingest_concurrency,
    )
    # Progress counts chunks; with the default word range a document is one chunk.
    progress = Progress("ingest", len(docs), "documents", every_s=10.0)
    ingest = await http_ingest(
        h.base_url,
        docs,
        batch_size=args.ingest_batch,
        concurrency=args.ingest_concurrency,
        progress=progress,
    )
    result["ingest"] = ingest
    logger.info(
        "ingested %d chunks of %d documents in %.1fs = %.1f chunks/s (%d failed, %d errors)",
        ingest["chunks"],
        ingest["indexed"],
        ingest["wall_s"],
        ingest["chunks_per_s"],
        ingest["failed"],
        ingest["errors"],
    )
    if ingest["errors"] or ingest["failed"]:
        raise RuntimeError(f"ingestion was not clean: {ingest}")

    store = h.milvus_store()
    try:
        # Connect before the timed work (every call would connect on first use anyway).
        await asyncio.to_thread(store.start)
        if filler_docs:
            from bench.filler import insert_filler
            from deployments.models.embedding import embedding_dim

            logger.info("writing %d filler documents straight into Milvus", len(filler_docs))
            result["filler"] = await asyncio.to_thread(
                insert_filler,
                store,
                filler_docs,
                h.settings,
                embedding_dim(h.settings.embedder),
                seed=args.seed,
            )
        if not args.no_flush:
            t0 = time.perf_counter()
            await asyncio.to_thread(store.flush)
            result["flush_s"] = round(time.perf_counter() - t0, 2)
            logger.info("Milvus flush took %.1fs", result["flush_s"])
        result["collection_rows"] = await asyncio.to_thread(store.owned.count_rows)
        logger.info("collection %s holds %d chunks", args.collection, result["collection_rows"])

        limits = httpx.Limits(max_connections=max(args.concurrency) + 2)
        async with httpx.AsyncClient(base_url=h.base_url, timeout=120.0, limits=limits) as client:
            warm = make_queries(
                args.warmup, args.tenants, args.seed + 1, tenant_prefix=tenant_prefix(args)
            )
            await search_level(args, client, warm, 1)
            result["search"] = []
            for level, concurrency in enumerate(args.concurrency):
                queries = make_queries(
                    args.requests,
                    args.tenants,
                    args.seed + 100 + level,
                    tenant_prefix=tenant_prefix(args),
                )
                logger.info("searching: %d requests at concurrency %d", len(queries), concurrency)
                res = await search_level(args, client, queries, concurrency)
                lat = res["latency"]
                logger.info(
                    "concurrency %d: p50 %s ms, p95 %s ms, %.1f req/s, %d errors",
                    concurrency,
                    lat.get("p50_ms"),
                    lat.get("p95_ms"),
                    res["requests_per_s"] or 0,
                    res["errors"],
                )
                result["search"].append(res)

        gateway_modes = sorted({m for r in result["search"] for m in r["modes"]})
        baseline_modes = ["dense"] + [m for m in gateway_modes if m != "dense"]
        result["baseline"] = await baseline(args, h, store, baseline_modes)
    finally:
        store.close()
    return result


def _latency_row(
    label: str, concurrency: int, lat: dict[str, Any], server: Any = "–", rps: Any = "–"
) -> list[Any]:
    return [
        label,
        concurrency,
        lat.get("n", 0),
        lat.get("p50_ms", "–"),
        lat.get("p95_ms", "–"),
        lat.get("p99_ms", "–"),
        server,
        rps,
    ]


def render_tables(result: dict[str, Any]) -> str:
    rows = []
    for r in result.get("search", []):
        row = _latency_row(
            f"gateway POST /rag/search_docs ({'/'.join(r['modes'])})",
            r["concurrency"],
            r["latency"],
            r["server_took"].get("p50_ms", "–"),
            r["requests_per_s"],
        )
        rows.append(row + [r["errors"]])
    base = result.get("baseline", {})
    for mode in ("dense", "hybrid", "bm25"):
        b = base.get(mode)
        if not b:
            continue
        what = "query embedding (handle)" if mode != "bm25" else "no embedding"
        rps = round(1000.0 / b["total"]["mean_ms"], 2)
        label = f"baseline: {what} + MilvusStore.search ({mode})"
        rows.append(_latency_row(label, 1, b["total"], rps=rps) + [0])
        if b["embed"]:
            rows.append(_latency_row("  of which: query embedding", 1, b["embed"]) + [0])
        label = f"  of which: Milvus search ({mode})"
        rows.append(_latency_row(label, 1, b["milvus"]) + [0])
    search_table = markdown_table(
        [
            "path",
            "concurrency",
            "requests",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "server took p50 ms",
            "req/s",
            "errors",
        ],
        rows,
    )
    ing = result.get("ingest")
    if not ing:
        return search_table
    ingest_table = markdown_table(
        ["ingest", "documents", "chunks", "wall s", "chunks/s", "request p50 ms", "failed"],
        [
            [
                "POST /ingest/documents",
                ing["indexed"],
                ing["chunks"],
                ing["wall_s"],
                ing["chunks_per_s"],
                ing["request_latency"].get("p50_ms", "–"),
                ing["failed"] + ing["errors"],
            ]
        ],
    )
    return search_table + "\n\n" + ingest_table


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    harness = ServeHarness(
        port=args.port,
        collection=args.collection,
        tenant_prefix=tenant_prefix(args),
        graph_enabled=not args.no_graph,
        ready_timeout_s=args.ready_timeout,
    )
    result: dict[str, Any] = {
        "benchmark": "search",
        "args": {k: v for k, v in vars(args).items() if k != "verbose"},
        "environment": environment_info(),
        "search_settings": harness.settings.search.model_dump(),
    }
    run_benchmark("search", harness, result, lambda h: run(args, h), render_tables, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
