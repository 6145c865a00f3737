"""Bulk ingestion inside Serve, per embedder variant, with searches during the load (issue 36).

    python -m bench.bench_bulk_ingest [--chapters 300] [--variants torch1,torch0,onnx0,int80]

Against a gateway started by ``scripts/start.sh`` (dev mode, 2 vCPUs): for each variant the
application is redeployed from ``serve_config.yaml`` with only the embedder changed
(``torch1``: torch, 1 thread, the setting shipped before issue 36; ``torch0``: torch,
threads = the node's cores; ``onnx0``: ONNX Runtime fp32; ``int80``: ONNX int8; the digit is
``embedder.torch_threads``; a trailing ``n``: ``embedder.nice`` 4). Then, in order:

1. a fresh search team of 300 AppStream descriptions is loaded, and 60 of its catalogue's
   summaries (natural-language queries) are searched one at a time: the idle p50;
2. ``--chapters`` KJV chapters (real text, several 200-token chunks each) are loaded for a
   fresh team by ``python -m batch_ingest.load_jsonl`` (its own process, ``--workers 2``) while
   one caller searches the search team every 0.25 s: chunks/s and the search p50 during
   the load.

Before the first variant the raw model is timed in this process on the chapters' own chunks
(batch 32, 2 threads, torch and each ONNX variant asked for, and SentenceTransformers'
``encode``): the ceiling a bulk load on these two cores could reach (``--raw-only`` with the
gateway stopped: only that). At the end ``serve_config.yaml`` is deployed again unchanged. Writes
``bench/results/bulk_ingest-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import REPO_ROOT, environment_info, setup_logging, write_result
from bench.realtext import appstream, kjv_chapters
from bench.redeploy_probe import APP, Serve, environment

logger = logging.getLogger("bench.bulk_ingest")
URL = "http://127.0.0.1:8000"
VARIANTS = {
    "torch1": {"backend": "transformers", "torch_threads": 1},
    "torch0": {"backend": "transformers", "torch_threads": 0},
    # fp32 ONNX names quantize: none (with backend onnx, quantize auto is int8).
    "onnx0": {"backend": "onnx", "quantize": "none", "torch_threads": 0},
    "int80": {"backend": "onnx", "quantize": "int8", "torch_threads": 0},
    "onnx1": {"backend": "onnx", "quantize": "none", "torch_threads": 1},
    "int81": {"backend": "onnx", "quantize": "int8", "torch_threads": 1},
    # The Embedder replica 4 steps nicer than the other replicas (Ray starts them at 15).
    "onnx0n": {"backend": "onnx", "quantize": "none", "torch_threads": 0, "nice": 4},
    "int80n": {"backend": "onnx", "quantize": "int8", "torch_threads": 0, "nice": 4},
}


def deploy(embedder: dict[str, Any], var: Path) -> float:
    """serve_config.yaml with ``embedder`` merged into its embedder section; seconds until
    the application runs it and /readyz answers 200."""
    config = yaml.safe_load((REPO_ROOT / "serve_config.yaml").read_text())
    config["applications"][0]["args"]["settings"]["embedder"].update(embedder)
    path = Path(tempfile.mkdtemp(prefix="bench_bulk_")) / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    since = time.time()
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "serve"), "deploy", str(path), "-a",
         "http://127.0.0.1:8265"],
        env=environment(var), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"serve deploy failed: {done.stderr[-2000:]}")
    serve = Serve()
    while time.monotonic() - started < 600:
        app = serve.client.get_serve_details().get("applications", {}).get(APP, {})
        if app.get("status") == "RUNNING" and app.get("last_deployed_time_s", 0) >= since:
            try:
                if httpx.get(f"{URL}/readyz", timeout=10).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
        time.sleep(1)
    raise SystemExit("the variant did not become ready in 600 s")


def raw_rates(texts: list[str], variants: list[str]) -> dict[str, float]:
    """texts/s of each variant's model in this process, batch 32, 2 threads, median of 3."""
    from deployments.config import EmbedderSettings
    from deployments.models.embedding import EmbedderCore

    out = {}
    for name in dict.fromkeys(v.rstrip("01n") for v in variants):
        kw = {k: v for k, v in VARIANTS[f"{name}0"].items() if k != "torch_threads"}
        core = EmbedderCore(EmbedderSettings(torch_threads=2, **kw))
        core.start()
        core.embed(texts[:32], "passage")  # warm
        rates = []
        for _ in range(3):
            started = time.perf_counter()
            for i in range(0, len(texts), 32):
                core.embed(texts[i : i + 32], "passage")
            rates.append(len(texts) / (time.perf_counter() - started))
        out[name] = round(statistics.median(rates), 1)
        logger.info("raw %s: %.1f texts/s", name, out[name])
    out["sentence_transformers"] = _st_rate(texts)
    return out


def _st_rate(texts: list[str]) -> float:
    """SentenceTransformers' own ``encode`` (batch 32, the same 2 threads): what the
    Haystack peer's embedder runs."""
    import torch
    from sentence_transformers import SentenceTransformer

    from deployments.models.embedding import default_model_path

    torch.set_num_threads(2)
    model = SentenceTransformer(str(default_model_path()), device="cpu", local_files_only=True)
    model.encode(texts[:32])
    rates = []
    for _ in range(3):
        started = time.perf_counter()
        model.encode(texts, batch_size=32)
        rates.append(len(texts) / (time.perf_counter() - started))
    rate = round(statistics.median(rates), 1)
    logger.info("raw sentence-transformers: %.1f texts/s", rate)
    return rate


class Searcher:
    """One caller searching ``team`` every ``every_s`` with real queries; latencies kept."""

    def __init__(self, team: str, queries: list[str], every_s: float = 0.25) -> None:
        self.team, self.queries, self.every_s = team, queries, every_s
        self.took: list[float] = []
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with httpx.Client(base_url=URL, timeout=120) as client:
            n = 0
            while not self.stop.is_set():
                query = self.queries[n % len(self.queries)]
                n += 1
                started = time.perf_counter()
                body = {"team_id": self.team, "query": query, "top_k": 10}
                r = client.post("/rag/search_docs", json=body)
                if r.status_code == 200:
                    self.took.append(time.perf_counter() - started)
                else:
                    self.errors += 1
                self.stop.wait(self.every_s)


def load_search_team(queries_source: Any, team: str) -> list[str]:
    docs = [{**d, "team_id": team} for d in queries_source.documents[:300]]
    with httpx.Client(base_url=URL, timeout=300) as client:
        for i in range(0, len(docs), 50):
            r = client.post("/ingest/documents", json={"documents": docs[i : i + 50]})
            r.raise_for_status()
    return list(queries_source.queries.values())


def idle_p50(team: str, queries: list[str], n: int = 60) -> float:
    took = []
    with httpx.Client(base_url=URL, timeout=120) as client:
        for q in queries[:n]:
            started = time.perf_counter()
            client.post("/rag/search_docs", json={"team_id": team, "query": q, "top_k": 10})
            took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def bulk_load(docs: list[dict[str, Any]], workers: int) -> tuple[float, int, str]:
    folder = Path(tempfile.mkdtemp(prefix="bench_bulk_"))
    path = folder / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    argv = [sys.executable, "-m", "batch_ingest.load_jsonl", str(path), "--url", URL,
            "--workers", str(workers)]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, proc.returncode, proc.stdout.strip()[-300:]


def run_variant(
    name: str, args: argparse.Namespace, var: Path, labeled: Any, chunks: int
) -> dict[str, Any]:
    embedder = VARIANTS[name]
    ready_s = deploy(embedder, var)
    tag = uuid.uuid4().hex[:6]
    search_team, bulk_team = f"bench_bulk_s_{tag}", f"bench_bulk_{tag}"
    queries = load_search_team(labeled, search_team)
    idle_p50(search_team, queries, 10)  # warm
    idle = idle_p50(search_team, queries)
    docs = kjv_chapters(bulk_team, args.chapters)
    searcher = Searcher(search_team, queries[60:])
    searcher.thread.start()
    took, rc, summary = bulk_load(docs, args.workers)
    searcher.stop.set()
    searcher.thread.join()
    during = statistics.median(searcher.took) * 1000 if searcher.took else None
    row = {
        "variant": name,
        "embedder": embedder,
        "ready_s": round(ready_s, 1),
        "load_s": round(took, 1),
        "chunks": chunks,
        "chunks_per_s": round(chunks / took, 2),
        "loader_rc": rc,
        "loader_summary": summary,
        "search_idle_p50_ms": round(idle, 1),
        "search_during_load_p50_ms": round(during, 1) if during else None,
        "searches_during_load": len(searcher.took),
        "search_errors": searcher.errors,
    }
    logger.info("%s", row)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chapters", type=int, default=300)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--variants", default="torch1,torch0,onnx0,int80")
    p.add_argument("--var", default=str(REPO_ROOT / "var"))
    p.add_argument("--no-raw", action="store_true", help="skip the raw model's rates")
    p.add_argument(
        "--raw-only",
        action="store_true",
        help="only the raw model's rates (stop the gateway first: its idle replicas cost ~15%%)",
    )
    args = p.parse_args(argv)
    setup_logging()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    var = Path(args.var)
    os.environ.update(environment(var))  # the dashboard's token, as scripts/start.sh sets it
    from bench.bench_loader import expected_chunks

    docs = kjv_chapters("count", args.chapters)
    want = expected_chunks(docs)
    chunks = sum(len(v) for v in want.values())
    texts = _chunk_texts(docs)
    tokens = _tokens(texts)
    logger.info("%d chapters, %d chunks, %d tokens", len(docs), chunks, tokens)
    raw = {} if args.no_raw else raw_rates(texts[:256], names)
    if args.raw_only:
        out = write_result("bulk_ingest_raw", {"chunks": chunks, "raw_texts_per_s_2_threads": raw})
        print(json.dumps(raw), f"written to {out}")
        return 0
    labeled = appstream("bench_bulk_s")
    rows = []
    try:
        for name in names:
            rows.append(run_variant(name, args, var, labeled, chunks))
    finally:
        deploy({}, var)
    result = {
        "chapters": len(docs),
        "chunks": chunks,
        "tokens": tokens,
        "raw_texts_per_s_2_threads": raw,
        "variants": rows,
        "environment": environment_info(),
    }
    out = write_result("bulk_ingest", result)
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=2))
    print(f"written to {out}")
    return 0


def _chunk_texts(docs: list[dict[str, Any]]) -> list[str]:
    from batch_ingest.chunks import chunk_builder
    from batch_ingest.documents import SourceDocument
    from batch_ingest.settings import BatchSettings

    settings = BatchSettings()
    builder = chunk_builder(settings.chunking, settings.embedder)
    return [c.text for d in docs for c in builder.build_chunks(SourceDocument.model_validate(d))]


def _tokens(texts: list[str]) -> int:
    from batch_ingest.chunking import tokenizer_counter
    from deployments.models.embedding import resolve_model_path

    count = tokenizer_counter(resolve_model_path(""))
    return sum(count(t) for t in texts)


if __name__ == "__main__":
    raise SystemExit(main())
