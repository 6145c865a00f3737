"""The GPU check of issue 18, one short run (bench/gpu_check.sh): embedder throughput raw vs.
through its Serve shell at batch 32/64/128 in float32 and float16, and reranker pairs/s.

Text: the paragraphs of this repository's own ``docs/*.md`` and ``README.md`` (real prose
that travels with the checkout, so the GPU machine needs no data package). The embedder is
the packaged all-MiniLM-L6-v2; the reranker a cross-encoder of MiniLM-L6's size with random
weights (``deployments.testing.tiny_models``: a forward pass costs the architecture's time, not the
weights'). "Serve shell" is ``EmbedderDeployment`` in this process: its ``@serve.batch``
queue, one text per request, ``batch`` requests in flight; "raw" is ``EmbedderCore.embed``
on lists of ``batch`` texts. Every figure is the median of ``--reps``.

Search p50: one query at a time, its embedding on the device plus the dense and BM25
candidates of the gateway's in-memory index
(``deployments.vector_store.memindex.team.TeamIndex``, what a search of a loaded team runs in
the Retriever) over the embedded paragraphs, fused. The
full path through Milvus Lite and Ray is bench/bench_search_real.py with
``EMBEDDER__DEVICE=cuda`` (it needs the services on the GPU machine).

    .venv/bin/python -m bench.gpu_check --device cuda
    .venv/bin/python -m bench.gpu_check --device cpu --batches 32 --texts 64 --reps 1
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_rerank import closed
from bench.common import environment_info, markdown_table, setup_logging, write_result
from deployments.config import EmbedderSettings, RerankerSettings
from deployments.models.embedder import EmbedderDeployment
from deployments.models.embedding import EmbedderCore
from deployments.models.reranker import RerankerDeployment
from deployments.testing.fakes import allow_batch_queue_outside_serve
from deployments.testing.tiny_models import build_tiny_cross_encoder

logger = logging.getLogger("bench.gpu_check")
ROOT = Path(__file__).resolve().parent.parent


def doc_paragraphs(min_chars: int = 200) -> list[str]:
    """Prose paragraphs of the repository's documentation (tables and code left out)."""
    out = []
    for path in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]):
        for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            text = " ".join(block.split())
            if len(text) >= min_chars and not text.startswith(("|", "```", "#", "    ")):
                out.append(text)
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


async def embedder_rows(args: argparse.Namespace, texts: list[str]) -> list[dict[str, Any]]:
    rows = []
    for dtype in args.dtypes:
        for batch in args.batches:
            settings = EmbedderSettings(
                device=args.device,
                dtype=dtype,
                forward_batch_size=batch,
                max_batch_size=batch,
                torch_threads=args.threads,
            )
            core = EmbedderCore(settings)
            core.start()
            core.embed(texts[:batch])  # warm-up
            raw = []
            for _ in range(args.reps):
                started = time.perf_counter()
                for i in range(0, len(texts), batch):
                    core.embed(texts[i : i + batch])
                _sync(core.device)
                raw.append(len(texts) / (time.perf_counter() - started))
            shell = EmbedderDeployment(settings)
            await shell._loading.wait()
            shell.reconfigure({"max_batch_size": batch, "batch_wait_timeout_s": 0.005})

            async def one(i: int, shell: EmbedderDeployment = shell) -> None:
                await shell.embed([texts[i]], "passage")

            await closed(batch, batch, one)  # warm-up
            served = []
            for _ in range(args.reps):
                served.append(len(texts) / await closed(batch, len(texts), one))
            row = {
                "dtype": core.dtype,
                "device": core.device,
                "batch": batch,
                "raw_texts_per_s": round(statistics.median(raw), 1),
                "serve_texts_per_s": round(statistics.median(served), 1),
            }
            row["ratio"] = round(row["serve_texts_per_s"] / row["raw_texts_per_s"], 2)
            logger.info("embedder %s", row)
            rows.append(row)
    return rows


async def reranker_rows(args: argparse.Namespace, texts: list[str]) -> list[dict[str, Any]]:
    path = build_tiny_cross_encoder(
        Path(tempfile.mkdtemp(prefix="gpu-check-")), hidden=384, layers=6, heads=12
    )
    queries = [t.split(". ")[0][:200] for t in texts]
    requests = [
        (queries[i % len(queries)], [texts[(i * 7 + j) % len(texts)] for j in range(20)])
        for i in range(args.rerank_requests)
    ]
    rows = []
    for dtype in args.dtypes:
        settings = RerankerSettings(
            enabled=True,
            model_path=str(path),
            device=args.device,
            dtype=dtype,
            forward_batch_size=64,
            # Passes of up to 64 pairs whatever their length on a GPU; the CPU default else.
            forward_max_tokens=32768 if args.device.startswith("cuda") else 4096,
            torch_threads=args.threads,
        )
        shell = RerankerDeployment(settings)
        await shell._loading.wait()

        async def one(i: int, shell: RerankerDeployment = shell) -> None:
            await shell.rerank(*requests[i])

        await closed(8, 8, one)  # warm-up
        rates = [len(requests) * 20 / await closed(8, len(requests), one) for _ in range(args.reps)]
        row = {
            "dtype": shell.core.dtype,
            "device": shell.core.device,
            "concurrency": 8,
            "pairs_per_s": round(statistics.median(rates), 1),
        }
        logger.info("reranker %s", row)
        rows.append(row)
    return rows


def search_rows(args: argparse.Namespace, paragraphs: list[str]) -> list[dict[str, Any]]:
    from deployments.protocols import ChunkRecord, SearchFilter
    from deployments.vector_store.filter import compile_filter
    from deployments.vector_store.memindex.team import TeamIndex
    from serve_app.search.ranking import fuse_weighted

    queries = [t.split(". ")[0][:200] for t in paragraphs][:64]
    flt = compile_filter(SearchFilter(team_id="bench"))
    rows = []
    for dtype in args.dtypes:
        core = EmbedderCore(EmbedderSettings(device=args.device, dtype=dtype))
        core.start()
        vectors = core.embed(paragraphs)
        index = TeamIndex(dim=vectors.shape[1])
        index.upsert(
            ChunkRecord(
                chunk_id=f"c{i}",
                doc_id=f"d{i}",
                team_id="bench",
                chunk_index=0,
                text=text,
                title="",
                content_hash=str(i),
                embed_model="bench",
                vector=[float(x) for x in vector],
            )
            for i, (text, vector) in enumerate(zip(paragraphs, vectors, strict=True))
        )
        core.embed(queries[:8], "query")  # warm-up
        times = []
        for _ in range(args.reps):
            for query in queries:
                started = time.perf_counter()
                vector = [float(x) for x in core.embed([query], "query")[0]]
                lists = {
                    "dense": index.search("dense", flt, 40, query_vector=vector),
                    "bm25": index.search("bm25", flt, 40, query_text=query),
                }
                fuse_weighted(lists, {"dense": 0.5, "bm25": 0.5})
                times.append((time.perf_counter() - started) * 1000)
        row = {
            "dtype": core.dtype,
            "device": core.device,
            "chunks": len(paragraphs),
            "queries": len(times),
            "search_p50_ms": round(statistics.median(times), 2),
        }
        logger.info("search %s", row)
        rows.append(row)
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    allow_batch_queue_outside_serve()
    paragraphs = doc_paragraphs()
    texts = [paragraphs[i % len(paragraphs)] for i in range(args.texts)]
    return {
        "texts": f"{len(paragraphs)} documentation paragraphs, {args.texts} per repetition",
        "embedder": await embedder_rows(args, texts),
        "reranker": await reranker_rows(args, paragraphs),
        "search": search_rows(args, paragraphs),
    }


def parse_list(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=parse_list, default="32,64,128")
    p.add_argument("--dtypes", type=lambda v: v.split(","), default="float32,float16")
    p.add_argument("--texts", type=int, default=1024, help="texts per repetition")
    p.add_argument("--rerank-requests", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    setup_logging(args.verbose)
    result: dict[str, Any] = {
        "benchmark": "gpu_check",
        "args": vars(args),
        "environment": environment_info(),
    }
    result |= asyncio.run(run(args))
    embed = markdown_table(
        ["device", "dtype", "batch", "raw texts/s", "Serve shell texts/s", "Serve/raw"],
        [
            [
                r["device"],
                r["dtype"],
                r["batch"],
                r["raw_texts_per_s"],
                r["serve_texts_per_s"],
                f"{r['ratio']:.2f}×",
            ]
            for r in result["embedder"]
        ],
    )
    rerank = markdown_table(
        ["device", "dtype", "concurrency", "pairs/s"],
        [[r["device"], r["dtype"], r["concurrency"], r["pairs_per_s"]] for r in result["reranker"]],
    )
    search = markdown_table(
        ["device", "dtype", "chunks", "queries", "search p50 ms"],
        [
            [r["device"], r["dtype"], r["chunks"], r["queries"], r["search_p50_ms"]]
            for r in result["search"]
        ],
    )
    result["table_markdown"] = "\n\n".join([embed, rerank, search])
    path = write_result("gpu_check", result, args.out)
    print(result["table_markdown"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
