"""Reranker throughput: requests that meet in one ``@serve.batch`` call sharing forward passes
(pairs concatenated, packed by token count) against the former batch body — per request, its
passages in the order given, ``--forward-batch`` pairs per pass padded to the longest —
same run, same model, real text.

The model is a cross-encoder of MiniLM-L6's size (6 layers of 384, 12 heads, the MiniLM
tokenizer) with random weights (``deployments.testing.tiny_models``; no reranker weights ship
offline) — the cost of a forward pass is the architecture's, not the weights'. Queries are
AppStream summaries, passages AppStream descriptions (``bench.realtext``); each request
reranks ``--pairs`` passages. ``RerankerDeployment`` runs in this process (its
``@serve.batch`` queue works without a Serve controller); ``--concurrency`` requests are in
flight at once, closed loop.

    .venv/bin/python -m bench.bench_rerank --concurrency 1,8
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve

from bench import realtext
from bench.common import (
    environment_info,
    markdown_table,
    parse_int_list,
    setup_logging,
    write_result,
)
from deployments.config import RERANK_BATCH, RERANK_BATCH_WAIT_S, RerankerSettings
from deployments.models.cross_encoding import relevance
from deployments.models.reranker import RerankerDeployment
from deployments.testing.fakes import allow_batch_queue_outside_serve
from deployments.testing.tiny_models import build_tiny_cross_encoder

logger = logging.getLogger("bench.rerank")


async def closed(concurrency: int, n: int, call: Any) -> float:
    """Seconds for ``n`` calls with ``concurrency`` in flight."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await call(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


def former_rerank(core: Any, query: str, texts: list[str]) -> np.ndarray:
    """The cross-encoder scoring before issue 18: one request, passes of
    ``forward_batch_size`` passages in the order given, each padded to its longest pair."""
    scores = np.empty(len(texts), dtype=np.float32)
    step = core.settings.forward_batch_size
    for start in range(0, len(texts), step):
        part = texts[start : start + step]
        batch = core._tokenizer(
            [query] * len(part),
            part,
            padding=True,
            truncation=True,
            max_length=core.settings.max_length,
            return_tensors="pt",
        )
        scores[start : start + len(part)] = relevance(core.forward(dict(batch)))
    return scores


class PerRequestReranker(RerankerDeployment):
    """The batch body before cross-request batching: the same ``@serve.batch`` queue, one
    forward set per request of the batch."""

    @serve.batch(max_batch_size=RERANK_BATCH, batch_wait_timeout_s=RERANK_BATCH_WAIT_S)
    async def _rerank_batch(self, requests: list[tuple[str, list[str]]]) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        return [
            await loop.run_in_executor(None, former_rerank, self.core, q, t) for q, t in requests
        ]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    labeled = realtext.appstream("bench_rerank")
    queries = [labeled.queries[q] for q in sorted(labeled.queries)]
    passages = [d["text"][:1500] for d in labeled.documents]
    n = len(passages)
    requests = [
        (queries[i % len(queries)], [passages[(i * 7 + j) % n] for j in range(args.pairs)])
        for i in range(args.requests)
    ]
    size = {"minilm": {"hidden": 384, "layers": 6, "heads": 12}, "tiny": {}}[args.model]
    path = build_tiny_cross_encoder(Path(tempfile.mkdtemp(prefix="bench-rerank-")), **size)
    settings = RerankerSettings(
        enabled=True,
        model_path=str(path),
        max_batch_size=args.max_batch,
        forward_batch_size=args.forward_batch,
        forward_max_tokens=args.forward_tokens,
    )
    allow_batch_queue_outside_serve()
    deployment = RerankerDeployment(settings)
    baseline = PerRequestReranker(settings)
    for d in (deployment, baseline):
        d.reconfigure({"max_batch_size": args.max_batch})
        await d._loading.wait()

    async def per_request(i: int) -> None:
        await baseline.rerank(*requests[i])

    async def shared(i: int) -> None:
        await deployment.rerank(*requests[i])

    for i in range(4):  # warm-up
        await shared(i)
        await per_request(i)
    out: list[dict[str, Any]] = []
    for concurrency in args.concurrency:
        row: dict[str, Any] = {"concurrency": concurrency}
        for name, call in (("per_request", per_request), ("shared", shared)):
            rates = []
            for _ in range(args.reps):
                wall = await closed(concurrency, len(requests), call)
                rates.append(len(requests) * args.pairs / wall)
            row[f"{name}_pairs_per_s"] = round(statistics.median(rates), 1)
            row[f"{name}_reps"] = [round(r, 1) for r in rates]
        row["ratio"] = round(row["shared_pairs_per_s"] / row["per_request_pairs_per_s"], 2)
        logger.info("c=%d: %s", concurrency, row)
        out.append(row)
    return {"model": f"{args.model}-size cross-encoder, random weights", "levels": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_rerank", description=__doc__)
    p.add_argument("--concurrency", type=parse_int_list, default="1,8")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--pairs", type=int, default=20, help="passages per request")
    p.add_argument("--max-batch", type=int, default=8, help="@serve.batch max_batch_size")
    p.add_argument(
        "--forward-batch", type=int, default=16, help="pairs per forward pass at most (the default)"
    )
    p.add_argument(
        "--forward-tokens", type=int, default=4096, help="padded tokens per shared pass at most"
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--model",
        choices=("minilm", "tiny"),
        default="minilm",
        help="MiniLM-L6's size, or the 2x32 test model (per-pass overhead dominates)",
    )
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    setup_logging(args.verbose)
    result: dict[str, Any] = {
        "benchmark": "rerank",
        "args": vars(args),
        "environment": environment_info(),
    }
    result |= asyncio.run(run(args))
    rows = [
        [
            lv["concurrency"],
            lv["per_request_pairs_per_s"],
            lv["shared_pairs_per_s"],
            f"{lv['ratio']:.2f}×",
        ]
        for lv in result["levels"]
    ]
    result["table_markdown"] = markdown_table(
        ["concurrency", "per request (same queue), pairs/s", "shared passes, pairs/s", "ratio"],
        rows,
    )
    path = write_result("rerank", result, args.out)
    print(result["table_markdown"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
