"""Embedding throughput: through Serve with @serve.batch, end-to-end HTTP ingestion, and raw.

Three measurements in one run, on the same synthetic texts (~100–140 words, one chunk each):

1. **Serve handle** (texts/s): many asyncio tasks call the ``Embedder`` deployment through a
   ``DeploymentHandle`` (``serve.get_deployment_handle("Embedder", app_name="rag")``), exactly
   as the ingress does, so requests are batched by ``@serve.batch``. Scenarios are
   ``CONCURRENCYxTEXTS`` (e.g. ``32x1``: 32 in flight, one text each; ``32x8``: eight each).
2. **HTTP ingestion** (chunks/s): ``POST /ingest/documents`` with concurrent clients; this
   includes chunking, Milvus reads/writes and the Neo4j MERGE, so it is the end-to-end rate.
3. **Raw** (texts/s): ``EmbedderCore.embed`` in this process at batch ``--raw-batch`` with
   the same ``EmbedderSettings`` as the deployment (1 torch thread), while Serve is down.

Every figure is the median of ``--reps`` repetitions; the table also gives handle/raw ratios.

    .venv/bin/python -m bench.bench_embed --help
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

from bench.common import (
    DEFAULT_PORT,
    Progress,
    closed_loop,
    environment_info,
    http_ingest,
    latency_summary,
    markdown_table,
    rate_summary,
    setup_logging,
    write_result,
)
from bench.corpus import generate_corpus, make_queries
from bench.serve_harness import ServeHarness

logger = logging.getLogger("bench.embed")


def parse_scenarios(value: str) -> list[tuple[int, int]]:
    """``"1x1,32x1,32x8"`` → ``[(1, 1), (32, 1), (32, 8)]`` (concurrency, texts/request)."""
    out = []
    for part in value.split(","):
        conc, _, k = part.strip().lower().partition("x")
        out.append((int(conc), int(k or 1)))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_embed",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="Serve HTTP port")
    p.add_argument(
        "--collection", default="bench_embed", help="Milvus collection (must start bench_)"
    )
    p.add_argument("--texts", type=int, default=256, help="texts per handle repetition")
    p.add_argument(
        "--kind",
        choices=("passage", "query"),
        default="passage",
        help="handle/raw texts: corpus passages (~155 tokens, one chunk each) or short "
        "2–4 word queries embedded as kind 'query'",
    )
    p.add_argument(
        "--scenarios",
        type=parse_scenarios,
        default="1x1,32x1,32x8",
        help="handle scenarios CONCURRENCYxTEXTS_PER_REQUEST, comma-separated",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions of every measurement")
    p.add_argument("--raw-batch", type=int, default=32, help="texts per raw embed() call")
    p.add_argument("--raw-texts", type=int, default=None, help="texts per raw rep (= --texts)")
    p.add_argument(
        "--raw-order",
        choices=("after", "before"),
        default="after",
        help="run the raw measurement after Serve is shut down, or before it starts",
    )
    p.add_argument("--http-docs", type=int, default=256, help="documents per HTTP repetition")
    p.add_argument("--http-batch", type=int, default=8, help="documents per HTTP request")
    p.add_argument("--http-concurrency", type=int, default=8, help="concurrent HTTP clients")
    p.add_argument("--tenants", type=int, default=4, help="tenants of the HTTP documents")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-words", type=int, default=100)
    p.add_argument("--max-words", type=int, default=140)
    p.add_argument("--skip-handle", action="store_true", help="skip the Serve handle part")
    p.add_argument("--skip-http", action="store_true", help="skip the HTTP ingestion part")
    p.add_argument("--skip-raw", action="store_true", help="skip the raw in-process part")
    p.add_argument("--no-graph", action="store_true", help="deploy without the Graph (Neo4j)")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for /readyz")
    p.add_argument("--out", default=None, help="result JSON (default bench/results/embed-*.json)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


# --- Serve handle --------------------------------------------------------------------------
async def handle_scenario(
    handle: Any, texts: list[str], kind: str, concurrency: int, per_request: int, reps: int
) -> dict[str, Any]:
    requests = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]

    async def call(batch: list[str]) -> int:
        vectors = await handle.embed.remote(batch, kind)
        if len(vectors) != len(batch):
            raise RuntimeError(f"asked for {len(batch)} vectors, got {len(vectors)}")
        return len(batch)

    rates, walls, all_latencies = [], [], []
    for rep in range(reps):
        wall, latencies, done, errors = await closed_loop(requests, concurrency, call)
        if errors:
            raise RuntimeError(f"{len(errors)} handle calls failed, first: {errors[0]!r}")
        rate = sum(done) / wall
        rates.append(rate)
        walls.append(round(wall, 3))
        all_latencies += latencies
        logger.info(
            "handle %dx%d rep %d/%d: %d texts in %.2fs = %.1f texts/s",
            concurrency,
            per_request,
            rep + 1,
            reps,
            sum(done),
            wall,
            rate,
        )
    return {
        "concurrency": concurrency,
        "texts_per_request": per_request,
        "texts": len(texts),
        "texts_per_s": rate_summary(rates),
        "wall_s": walls,
        "request_latency": latency_summary(all_latencies),
    }


async def serve_part(args: argparse.Namespace, h: ServeHarness, texts: list[str]) -> dict:
    out: dict[str, Any] = {}
    if not args.skip_handle:
        handle = h.embedder_handle()
        # Warm-up of the handle/router path and the model; not measured.
        for text in texts[:8]:
            await handle.embed.remote([text], args.kind)
        out["handle"] = []
        for conc, k in args.scenarios:
            out["handle"].append(
                await handle_scenario(handle, texts, args.kind, conc, k, args.reps)
            )
    if not args.skip_http:
        prefix = f"{args.collection}_t"
        warm = generate_corpus(
            args.http_batch, args.tenants, args.seed, tenant_prefix=prefix, doc_prefix="warm"
        )
        await http_ingest(h.base_url, warm, batch_size=args.http_batch, concurrency=1)
        reps = []
        for rep in range(args.reps):
            docs = generate_corpus(
                args.http_docs,
                args.tenants,
                args.seed + 1000 + rep,
                min_words=args.min_words,
                max_words=args.max_words,
                tenant_prefix=prefix,
                doc_prefix=f"http-r{rep}",
            )
            progress = Progress(f"HTTP ingest rep {rep + 1}/{args.reps}", len(docs), "documents")
            result = await http_ingest(
                h.base_url,
                docs,
                batch_size=args.http_batch,
                concurrency=args.http_concurrency,
                progress=progress,
            )
            if result["errors"] or result["failed"] or result["unchanged"]:
                raise RuntimeError(f"HTTP ingest rep {rep + 1} was not clean: {result}")
            logger.info(
                "HTTP ingest rep %d/%d: %d chunks in %.2fs = %.1f chunks/s",
                rep + 1,
                args.reps,
                result["chunks"],
                result["wall_s"],
                result["chunks_per_s"],
            )
            reps.append(result)
        out["http_ingest"] = {
            "docs_per_rep": args.http_docs,
            "docs_per_request": args.http_batch,
            "concurrency": args.http_concurrency,
            "chunks_per_s": rate_summary([r["chunks_per_s"] for r in reps]),
            "reps": reps,
        }
    return out


# --- raw in-process ------------------------------------------------------------------------
def raw_part(args: argparse.Namespace, settings: Any, texts: list[str]) -> dict[str, Any]:
    from deployments.models.embedding import EmbedderCore

    core = EmbedderCore(settings.embedder)
    t0 = time.perf_counter()
    core.start()
    load_s = time.perf_counter() - t0
    import torch

    batch = args.raw_batch
    core.embed(texts[:batch], args.kind)  # warm-up
    rates = []
    for rep in range(args.reps):
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            core.embed(texts[i : i + batch], args.kind)
        wall = time.perf_counter() - started
        rates.append(len(texts) / wall)
        logger.info(
            "raw rep %d/%d: %d texts in %.2fs = %.1f texts/s",
            rep + 1,
            args.reps,
            len(texts),
            wall,
            rates[-1],
        )
    return {
        "batch": batch,
        "texts": len(texts),
        "torch_threads": torch.get_num_threads(),
        "forward_batch_size": settings.embedder.forward_batch_size,
        "load_s": round(load_s, 2),
        "texts_per_s": rate_summary(rates),
    }


def make_texts(args: argparse.Namespace, n: int) -> list[str]:
    if args.kind == "query":
        return [q for _, q in make_queries(n, 1, args.seed)]
    corpus = generate_corpus(n, 1, args.seed, min_words=args.min_words, max_words=args.max_words)
    return [d["text"] for d in corpus]


def render_table(result: dict[str, Any]) -> str:
    raw = result.get("raw", {}).get("texts_per_s", {}).get("median")
    kind = {"passage": "passages", "query": "queries"}[result["args"]["kind"]]
    rows = []
    for s in result.get("handle", []):
        med = s["texts_per_s"]["median"]
        rows.append(
            [
                "Serve handle (@serve.batch)",
                f"{s['concurrency']} in flight × {s['texts_per_request']} {kind}/request",
                med,
                f"{s['texts_per_s']['min']:.1f}–{s['texts_per_s']['max']:.1f}",
                "texts/s",
                f"{med / raw:.2f}×" if raw else "–",
            ]
        )
    if "http_ingest" in result:
        hi = result["http_ingest"]
        cps = hi["chunks_per_s"]
        rows.append(
            [
                "HTTP POST /ingest/documents",
                f"{hi['concurrency']} clients × {hi['docs_per_request']} docs",
                cps["median"],
                f"{cps['min']:.1f}–{cps['max']:.1f}",
                "chunks/s",
                f"{cps['median'] / raw:.2f}×" if raw else "–",
            ]
        )
    if "raw" in result:
        r = result["raw"]
        rows.append(
            [
                "raw EmbedderCore.embed",
                f"batch {r['batch']} {kind}, {r['torch_threads']} torch thread(s)",
                r["texts_per_s"]["median"],
                f"{r['texts_per_s']['min']:.1f}–{r['texts_per_s']['max']:.1f}",
                "texts/s",
                "1.00×",
            ]
        )
    return markdown_table(["measurement", "load", "median", "min–max", "unit", "vs raw"], rows)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    texts = make_texts(args, args.texts)
    raw_texts = texts
    if args.raw_texts and args.raw_texts != len(texts):
        raw_texts = make_texts(args, args.raw_texts)
    harness = ServeHarness(
        port=args.port,
        collection=args.collection,
        tenant_prefix=f"{args.collection}_t",
        graph_enabled=not args.no_graph,
        ready_timeout_s=args.ready_timeout,
    )
    result: dict[str, Any] = {
        "benchmark": "embed",
        "args": {k: v for k, v in vars(args).items() if k != "verbose"},
        "environment": environment_info(),
        "embedder_settings": harness.settings.embedder.model_dump(),
    }
    started = time.perf_counter()
    try:
        if not args.skip_raw and args.raw_order == "before":
            result["raw"] = raw_part(args, harness.settings, raw_texts)
        if not (args.skip_handle and args.skip_http):
            with harness:
                result["startup_s"] = harness.startup_s
                result.update(asyncio.run(serve_part(args, harness, texts)))
        if not args.skip_raw and args.raw_order == "after":
            result["raw"] = raw_part(args, harness.settings, raw_texts)
    finally:
        harness.stop()  # idempotent; removes the temp folder when Serve never ran
    result["total_s"] = round(time.perf_counter() - started, 1)
    raw = result.get("raw", {}).get("texts_per_s", {}).get("median")
    if raw:
        result["ratios_vs_raw"] = {
            f"{s['concurrency']}x{s['texts_per_request']}": round(
                s["texts_per_s"]["median"] / raw, 3
            )
            for s in result.get("handle", [])
        }
    result["table_markdown"] = render_table(result)
    write_result("embed", result, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
