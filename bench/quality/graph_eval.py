"""Does graph-scoped retrieval help? A labeled set where the graph knows something the text
does not, measured through the public API.

Documents: the KJV verses of books with many parallel passages (Samuel–Kings–Chronicles, the
synoptic gospels), each titled only ``<chapter>:<verse>`` and ingested with ``project_id`` =
its book; the Project nodes get the book's name through ``POST /graph/entities``. So which
book a verse belongs to lives in the graph and in no text the retrievers see. Queries: a
12-word window of the same verse in the WEB translation, prefixed by the book's name
("Luke: ..."), as a user would say "in project X, ...". Relevant: the verse.

Rows: BM25, dense, the server's hybrid default, hybrid + ``graph: boost`` (weight tuned on the
dev queries), hybrid + ``graph: scope``; and the control: the same queries *without* the book
name, where the graph must change nothing. Also the median latency of each configuration.

    .venv/bin/python -m bench.quality.graph_eval
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import time
from typing import Any

import httpx

from bench.common import markdown_table, setup_logging, write_result
from bench.quality.bible_set import KJV_MODULE, WEB_MODULE, doc_id, export_module
from bench.quality.metrics import distinct, evaluate

logger = logging.getLogger("bench.quality.graph")

BOOKS = (
    "I_Samuel",
    "II_Samuel",
    "I_Kings",
    "II_Kings",
    "I_Chronicles",
    "II_Chronicles",
    "Matthew",
    "Mark",
    "Luke",
)
TEAM = "bench_graph_t0"


def book_name(book: str) -> str:
    """``II_Kings`` → ``2 Kings``."""
    name = book.replace("_", " ")
    for roman, digit in (("III ", "3 "), ("II ", "2 "), ("I ", "1 ")):
        if name.startswith(roman):
            return digit + name[len(roman) :]
    return name


def project_id(book: str) -> str:
    return "book_" + book.lower()


def build(n_queries: int, n_dev: int, words: int, seed: int = 17) -> dict[str, Any]:
    kjv, web = export_module(KJV_MODULE), export_module(WEB_MODULE)
    refs = [r for r in kjv if r[0] in BOOKS]
    documents = [
        {
            "team_id": TEAM,
            "doc_id": doc_id(ref),
            "doc_type": "doc",
            "title": f"{ref[1]}:{ref[2]}",
            "text": kjv[ref],
            "project_id": project_id(ref[0]),
        }
        for ref in refs
    ]
    rng = random.Random(seed)
    candidates = [r for r in refs if r in web and len(web[r].split()) >= words]
    picked = rng.sample(candidates, min(n_queries, len(candidates)))
    queries, plain, qrels = {}, {}, {}
    for i, ref in enumerate(picked):
        qid = f"q{i:04d}"
        text = web[ref].split()
        start = rng.randrange(len(text) - words + 1)
        window = " ".join(text[start : start + words])
        plain[qid] = window
        queries[qid] = f"{book_name(ref[0])}: {window}"
        qrels[qid] = {doc_id(ref): 1}
    ids = list(queries)
    return {
        "documents": documents,
        "queries": queries,
        "plain": plain,
        "qrels": qrels,
        "dev": ids[:n_dev],
        "test": ids[n_dev:],
    }


async def run(
    base: str, queries: dict[str, str], ids: list[str], options: dict[str, Any]
) -> tuple[dict[str, list[str]], list[float], int]:
    """Ranked doc ids per query, per-request latencies (ms, measured one at a time) and how
    many answers said the graph was applied."""
    out: dict[str, list[str]] = {}
    latencies: list[float] = []
    applied = 0
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        for qid in ids:
            body = {"team_id": TEAM, "query": queries[qid], "top_k": 10, **options}
            started = time.perf_counter()
            r = await client.post("/rag/search_docs", json=body)
            latencies.append((time.perf_counter() - started) * 1000)
            r.raise_for_status()
            answer = r.json()
            applied += bool((answer.get("graph") or {}).get("applied"))
            out[qid] = distinct([m["source_ref"]["id"] for m in answer["matches"]])
    return out, latencies, applied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-queries", type=int, default=300)
    parser.add_argument("--n-dev", type=int, default=100)
    parser.add_argument("--words", type=int, default=12, help="query window in words")
    parser.add_argument("--threads", type=int, default=2, help="embedder torch threads")
    parser.add_argument("--max-docs", type=int, default=1200, help="graph option max_docs")
    parser.add_argument("--port", type=int, default=8310)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    setup_logging()

    from bench.common import Progress, http_ingest
    from bench.serve_harness import ServeHarness

    data = build(args.n_queries, args.n_dev, args.words)
    logger.info(
        "%d documents of %d books, %d queries (%d dev, %d test)",
        len(data["documents"]),
        len(BOOKS),
        len(data["queries"]),
        len(data["dev"]),
        len(data["test"]),
    )
    graph_opt = {"max_entities": 3, "max_docs": args.max_docs}
    with ServeHarness(
        port=args.port,
        collection="bench_graph",
        tenant_prefix="bench_graph",
        graph_enabled=True,
        settings={"embedder": {"torch_threads": args.threads}},
    ) as harness:
        base = harness.base_url
        progress = Progress("ingest", len(data["documents"]), "documents", every_s=20.0)
        ingest = asyncio.run(
            http_ingest(base, data["documents"], batch_size=64, concurrency=2, progress=progress)
        )
        logger.info("ingested %s documents in %.0f s", ingest["indexed"], ingest["wall_s"])
        entities = {
            "team_id": TEAM,
            "nodes": [
                {"label": "Project", "id": project_id(b), "name": book_name(b)} for b in BOOKS
            ],
        }
        httpx.post(base + "/graph/entities", json=entities, timeout=60).raise_for_status()

        # Tune the boost weight on the dev queries only.
        best_w, best = 0.3, -1.0
        for w in (0.1, 0.3, 0.5, 1.0, 2.0):
            runs, _, _ = asyncio.run(
                run(
                    base,
                    data["queries"],
                    data["dev"],
                    {"graph": {"mode": "boost", "weight": w, **graph_opt}},
                )
            )
            ndcg = evaluate(runs, data["qrels"])["ndcg@10"]
            logger.info("dev: graph boost weight %.1f → nDCG@10 %.4f", w, ndcg)
            if ndcg > best:
                best_w, best = w, ndcg
        configs = [
            ("BM25 only", "queries", {"search_mode": "bm25"}),
            ("dense only", "queries", {"search_mode": "dense"}),
            ("hybrid, server default", "queries", {}),
            (
                f"hybrid + graph boost (weight {best_w:g}, tuned on dev)",
                "queries",
                {"graph": {"mode": "boost", "weight": best_w, **graph_opt}},
            ),
            ("hybrid + graph scope", "queries", {"graph": {"mode": "scope", **graph_opt}}),
            ("control, no book name: hybrid", "plain", {}),
            (
                f"control, no book name: hybrid + graph boost ({best_w:g})",
                "plain",
                {"graph": {"mode": "boost", "weight": best_w, **graph_opt}},
            ),
        ]
        rows = []
        for name, which, options in configs:
            runs, latencies, applied = asyncio.run(run(base, data[which], data["test"], options))
            scores = evaluate(runs, data["qrels"])
            p50 = statistics.median(latencies)
            logger.info(
                "%s: %s p50 %.1f ms", name, {k: round(v, 4) for k, v in scores.items()}, p50
            )
            rows.append(
                {
                    "config": name,
                    "options": options,
                    "p50_ms": p50,
                    "graph_applied": applied,
                    **scores,
                }
            )

    def baseline(row: dict[str, Any]) -> dict[str, Any]:
        """Plain hybrid on the same queries (with or without the book name)."""
        return rows[5] if row["config"].startswith("control") else rows[2]

    table = markdown_table(
        [
            "configuration",
            "nDCG@10",
            "MRR@10",
            "Recall@10",
            "Δ nDCG vs hybrid",
            "p50 ms",
            "graph applied",
        ],
        [
            [
                r["config"],
                f"{r['ndcg@10']:.4f}",
                f"{r['mrr@10']:.4f}",
                f"{r['recall@10']:.4f}",
                f"{r['ndcg@10'] - baseline(r)['ndcg@10']:+.4f}",
                f"{r['p50_ms']:.1f}",
                f"{r['graph_applied']}/{len(data['test'])}",
            ]
            for r in rows
        ],
    )
    print(
        f"\ngraph-scoped retrieval, {len(data['documents'])} documents, "
        f"{len(data['test'])} test queries ({args.words}-word WEB windows)\n\n{table}"
    )
    write_result(
        "graph-quality",
        {"rows": rows, "documents": len(data["documents"]), "ingest": ingest, "books": BOOKS},
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
