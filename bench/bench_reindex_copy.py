"""Reindex speed by what changed (issue 33): an unchanged model copies vectors, a model change
embeds; both against the raw model on the same texts and cores, in one run.

    .venv/bin/python -m bench.bench_reindex_copy --chapters 150 --reps 2

Data: the first ``--chapters`` King James chapters (Debian ``sword-text-kjv``, real text,
several 200-token chunks each) as one team's documents in a scratch source registry, its
live version ``v1`` written with the gateway's chunker and the default model's vectors
(bench/realtext.py, cached). Then, each ``--reps`` times, on a local Ray of 2 CPUs (what
scripts/start.sh gives Ray) with the shipped pool (1 actor, 0.5 CPU, batches of 16 documents):

- ``copy``: ``v1`` tagged with the current model: the job copies every vector (index, schema
  or metadata migration). Before issue 33 every reindex took the ``embed`` path.
- ``embed_<n>_threads``: ``v1`` tagged with another model: every chunk is embedded (a model
  change), with ``reindex.torch_threads`` = n (``--threads``; 0, the default, is every core).
- ``raw``: ``EmbedderCore.embed`` over the same chunk texts, batches of 32, model warm, with
  ``--raw-threads`` torch threads (1 and 2), once before and once after the jobs (the figure
  is their median): the ceiling of the machine.

Figures: end-to-end chunks/s of the job (new version, pool start, verification, switch,
drop), medians; the rate once running (the chunks of every result after the first over the
time from the first result to the last: the job's throughput without its start-up and its
end); ``copy ÷ embed`` and ``embed ÷ raw``, end to end and once running. Needs the Milvus
Lite server.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from batch_ingest.documents import SourceDocument
from batch_ingest.reindex import Reindexer, ReindexOptions
from batch_ingest.source_store import SourceStore
from bench.common import markdown_table, setup_logging, start_local_ray, write_result
from bench.realtext import build_chunks, embed_chunks, kjv_chapters
from serve_app.settings import GatewaySettings

logger = logging.getLogger("bench.reindex_copy")
TEAM = "bench_reindex_copy"


def write_v1(store, chunks, tag: str) -> None:
    """The team's live v1 (dropped first): ``chunks`` with their vectors under ``tag``."""
    for version in store.versions.existing(TEAM):
        if store.versions.current(TEAM) == version:
            continue
        store.versions.drop(TEAM, version)
    store.drop()
    store.start()
    physical = store.versions.create(TEAM, 1)
    rows = [replace(c, embed_model=tag) for c in chunks]
    for start in range(0, len(rows), 256):
        store.versions.upsert(physical, rows[start : start + 256])
    store.versions.flush(physical)
    store.versions.switch(TEAM, 1)


def run_job(settings, store, sources) -> dict[str, Any]:
    arrivals: list[tuple[float, int]] = []  # (seconds since the start, chunks) per result

    def timed(sink):
        def record(rows):
            arrivals.append((time.perf_counter() - started, sum(r["chunks"] for r in rows)))
            sink(rows)

        return record

    started = time.perf_counter()
    result = Reindexer(settings, versions=store.versions, sources=sources, wrap_sink=timed).run(
        ReindexOptions(team_id=TEAM, engine="ray", log_every_s=30)
    )
    wall = time.perf_counter() - started
    job = result.job
    assert job.status == "succeeded" and job.rows_in_target == job.expected_chunks
    return {
        "wall_s": round(wall, 2),
        "chunks": job.expected_chunks,
        "embedded": job.written_chunks,
        "chunks_per_s": round(job.expected_chunks / wall, 1),
        **steady(arrivals),
    }


def steady(arrivals: list[tuple[float, int]]) -> dict[str, Any]:
    """When the first result reached the driver (pool start, imports, model load, first
    batch) and the rate from there to the last result: the chunks of every later result over
    the time between the first and the last (the job's throughput once it runs)."""
    if len(arrivals) < 2:
        return {"first_result_s": arrivals[0][0] if arrivals else None}
    (first, _), (last, _) = arrivals[0], arrivals[-1]
    later = sum(n for _, n in arrivals[1:])
    return {
        "first_result_s": round(first, 2),
        "last_result_s": round(last, 2),
        "results": len(arrivals),
        "steady_chunks_per_s": round(later / (last - first), 1) if last > first else None,
    }


def raw_rate(settings, texts: list[str], threads: int) -> float:
    import torch

    from deployments.models.embedding import EmbedderCore

    core = EmbedderCore(settings.embedder.model_copy(update={"torch_threads": threads}))
    core.start()
    torch.set_num_threads(threads)
    core.embed(texts[:32])
    started = time.perf_counter()
    for i in range(0, len(texts), 32):
        core.embed(texts[i : i + 32])
    return len(texts) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chapters", type=int, default=150)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument(
        "--threads",
        default="1,0",
        help="reindex.torch_threads values for the embed path (0: the machine's cores)",
    )
    parser.add_argument("--skip-copy", action="store_true")
    parser.add_argument(
        "--raw-threads", default="1,2", help="torch threads of the raw model's runs"
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    setup_logging()
    tmp = Path(tempfile.mkdtemp(prefix="bench-reindex-copy-"))
    settings = GatewaySettings(
        milvus={"collection": "bench_reindex_copy"}, state={"url": f"sqlite:///{tmp}/state.db"}
    )
    from deployments.vector_store.store import MilvusStore

    docs = kjv_chapters(TEAM, args.chapters)
    chunks = embed_chunks(build_chunks(docs, settings), settings, name="kjv-chapters")
    texts = [c.text for c in chunks]
    store = MilvusStore(settings.milvus, dim=384)
    store.start()
    sources = SourceStore(settings.state.url)
    sources.put([SourceDocument.model_validate(d) for d in docs])
    logger.info("corpus: %d chapters, %d chunks", len(docs), len(chunks))
    tag = settings.embedder.embed_model_tag

    results: dict[str, Any] = {
        "data": f"KJV chapters 1-{len(docs)}",
        "documents": len(docs),
        "chunks": len(chunks),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    raw_threads = [int(x) for x in args.raw_threads.split(",")]
    # The raw model before and after the jobs (the machine drifts); its figure is the median.
    raw_runs = {t: [raw_rate(settings, texts, t)] for t in raw_threads}
    logger.info("raw before the jobs: %s chunks/s", raw_runs)

    start_local_ray(tmp, 2)
    import ray

    try:
        paths = [] if args.skip_copy else [("copy", tag, settings)]
        for t in (int(x) for x in args.threads.split(",")):
            job_settings = settings.model_copy(
                update={"reindex": settings.reindex.model_copy(update={"torch_threads": t})}
            )
            paths.append((f"embed_{t}_threads", "all-MiniLM-L6-v2@old", job_settings))
        for name, v1_tag, job_settings in paths:
            runs = []
            for rep in range(args.reps):
                write_v1(store, chunks, v1_tag)
                runs.append(run_job(job_settings, store, sources))
                logger.info("%s rep %d: %s", name, rep + 1, runs[-1])
            results[name] = {
                "runs": runs,
                "median_chunks_per_s": statistics.median(r["chunks_per_s"] for r in runs),
                "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            }
    finally:
        ray.shutdown()
        store.drop()
        store.close()
    for t in raw_threads:
        raw_runs[t].append(raw_rate(settings, texts, t))
    results["raw_runs"] = {f"{t}_threads": [round(x, 1) for x in v] for t, v in raw_runs.items()}
    results["raw"] = {f"{t}_threads": round(statistics.median(v), 1) for t, v in raw_runs.items()}
    logger.info("raw before and after the jobs: %s chunks/s", results["raw_runs"])
    raw_best = max(results["raw"].values())
    embeds = {k: v for k, v in results.items() if k.startswith("embed_")}
    best_embed = max(v["median_chunks_per_s"] for v in embeds.values())
    rows = [
        [name, v["median_wall_s"], v["median_chunks_per_s"]]
        for name, v in results.items()
        if name == "copy" or name.startswith("embed_")
    ]
    rows += [[f"raw model, {k.replace('_', ' ')}", "", v] for k, v in results["raw"].items()]
    print(markdown_table(["path", "median wall s", "median chunks/s"], rows))
    for name, v in embeds.items():
        v["vs_raw_best"] = round(v["median_chunks_per_s"] / raw_best, 3)
        rates = [r["steady_chunks_per_s"] for r in v["runs"] if r.get("steady_chunks_per_s")]
        if rates:
            v["median_steady_chunks_per_s"] = statistics.median(rates)
            v["steady_vs_raw_best"] = round(v["median_steady_chunks_per_s"] / raw_best, 3)
        print(
            f"{name} ÷ best raw = {v['vs_raw_best']} end to end, "
            f"{v.get('steady_vs_raw_best')} once running"
        )
    if "copy" in results:
        results["copy_vs_embed"] = round(results["copy"]["median_chunks_per_s"] / best_embed, 1)
        print(f"copy ÷ fastest embed = {results['copy_vs_embed']}×")
    write_result("reindex_copy", results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
