"""What the embedder's Serve shell costs per batch beyond the model's forward pass.

The GPU check (bench/gpu_check.sh) on an H200 found the shell at 0.76-0.92x the raw model:
with a ~50 ms forward pass per batch of 128, ~16 ms per batch went to the queue. This
benchmark isolates that cost on any machine: ``EmbedderDeployment``'s ``@serve.batch``
queue with the model's ``encode`` replaced by a fixed-time stand-in (``--forward-ms``, the
per-batch times the H200 measured), ``batch`` callers of one text each in flight (the GPU
check's closed loop), texts the paragraphs of this repository's docs. The projected
Serve/raw ratio is forward time / shell time per batch.

    .venv/bin/python -m bench.bench_batch_queue --forward-ms 22,50 --batch 128
    # the baseline: the same command with PYTHONPATH at a worktree of the older commit
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np

from bench.bench_rerank import closed
from bench.common import environment_info, markdown_table, setup_logging, write_result
from bench.gpu_check import doc_paragraphs
from deployments.config import EmbedderSettings
from deployments.models.embedder import EmbedderDeployment
from deployments.protocols import Encoded
from deployments.testing.fakes import allow_batch_queue_outside_serve


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    allow_batch_queue_outside_serve()
    texts = doc_paragraphs()
    shell = EmbedderDeployment(EmbedderSettings(device="cpu"))
    await shell._loading.wait()
    shell.reconfigure({"max_batch_size": args.batch, "batch_wait_timeout_s": 0.005})
    dim = int(shell.core.dim or 384)
    rows = []
    for forward_ms in args.forward_ms:

        def stand_in(flat: list[str], kind: str, seconds: float = forward_ms / 1000) -> Encoded:
            time.sleep(seconds)
            return Encoded(np.zeros((len(flat), dim), dtype=np.float32), None)

        shell.core.encode = stand_in  # type: ignore[method-assign,assignment]

        async def one(i: int) -> None:
            await shell.embed([texts[i % len(texts)]], "passage")

        n = args.batch * args.batches
        await closed(args.batch, args.batch, one)  # warm-up
        per_batch = [
            await closed(args.batch, n, one) / args.batches * 1000 for _ in range(args.reps)
        ]
        shell_ms = statistics.median(per_batch)
        rows.append(
            {
                "forward_ms": forward_ms,
                "batch": args.batch,
                "shell_ms_per_batch": round(shell_ms, 2),
                "queue_ms_per_batch": round(shell_ms - forward_ms, 2),
                "projected_ratio": round(forward_ms / shell_ms, 3),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forward-ms", type=lambda v: [float(x) for x in v.split(",")], default="22,50")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=20, help="batches per repetition")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    setup_logging()
    rows = asyncio.run(measure(args))
    table = markdown_table(
        ["forward ms", "batch", "shell ms/batch", "queue ms/batch", "projected Serve/raw"],
        [
            [
                r["forward_ms"],
                r["batch"],
                r["shell_ms_per_batch"],
                r["queue_ms_per_batch"],
                r["projected_ratio"],
            ]
            for r in rows
        ],
    )
    print(table)
    write_result(
        "batch_queue",
        {
            "benchmark": "batch_queue",
            "args": vars(args),
            "environment": environment_info(),
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
