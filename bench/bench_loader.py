"""The bulk loader under a CPU hog (issue 36): every document of a 2,000+-document real-text
load arrives exactly once, and the loader says how it went.

    python -m bench.bench_loader --url http://127.0.0.1:8000 [--hogs 1] [--workers 2]

Writes the AppStream descriptions (2,126 documents) as a JSON-lines file for a fresh team,
starts ``--hogs`` busy processes (a pure-Python loop each, at normal priority, as another
job on the machine would be), runs ``python -m batch_ingest.load_jsonl`` on the file as a
user would (its own process, its progress bar on stderr), then counts, in Milvus, each
document's chunks against what the pipeline makes of it: documents missing, chunks missing,
chunk ids stored twice. Writes ``bench/results/loader-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, environment_info, setup_logging, write_result
from bench.realtext import appstream


def hog(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x = (x * 31 + 7) % 1_000_003


def expected_chunks(docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """doc_id → the chunk ids the gateway's pipeline makes of it (same chunker settings)."""
    from batch_ingest.chunks import chunk_builder
    from batch_ingest.documents import SourceDocument
    from batch_ingest.settings import BatchSettings

    settings = BatchSettings()
    builder = chunk_builder(settings.chunking, settings.embedder)
    return {
        d["doc_id"]: {c.chunk_id for c in builder.build_chunks(SourceDocument.model_validate(d))}
        for d in docs
    }


def stored_chunks(team: str, doc_ids: list[str]) -> dict[str, list[str]]:
    from batch_ingest.settings import BatchSettings
    from deployments.models.embedding import embedding_dim
    from deployments.vector_store.store import MilvusStore

    settings = BatchSettings()
    store = MilvusStore(settings.milvus, dim=embedding_dim(settings.embedder))
    rows = store.fingerprints([(team, "doc", d) for d in doc_ids])
    return {key[2]: [cid for cid, _, _ in chunks] for key, chunks in rows.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--token", default="")
    p.add_argument("--hogs", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    setup_logging()
    team = f"bench_loader_{uuid.uuid4().hex[:6]}"
    docs = [{**d, "team_id": team} for d in appstream(team).documents]
    folder = Path(tempfile.mkdtemp(prefix="bench_loader_"))
    path = folder / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    argv_load = [sys.executable, "-m", "batch_ingest.load_jsonl", str(path), "--url", args.url,
                 "--workers", str(args.workers)]  # fmt: skip
    if args.token:
        argv_load += ["--token", args.token]
    stop_at = time.time() + 3600
    hogs = [multiprocessing.Process(target=hog, args=(stop_at,)) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv_load, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    finally:
        for h in hogs:
            h.terminate()
    took = time.perf_counter() - started
    want = expected_chunks(docs)
    have = stored_chunks(team, list(want))
    missing_docs = [d for d in want if not have.get(d)]
    missing_chunks = sum(len(want[d] - set(have.get(d, []))) for d in want)
    extra_chunks = sum(len(set(have.get(d, [])) - want[d]) for d in want)
    duplicated = sum(n - 1 for d in have.values() for n in Counter(d).values() if n > 1)
    result = {
        "team": team,
        "documents": len(docs),
        "chunks_expected": sum(len(v) for v in want.values()),
        "chunks_stored": sum(len(v) for v in have.values()),
        "documents_missing": len(missing_docs),
        "chunks_missing": missing_chunks,
        "chunks_extra": extra_chunks,
        "chunk_ids_stored_twice": duplicated,
        "hogs": args.hogs,
        "workers": args.workers,
        "load_s": round(took, 1),
        "loader_rc": proc.returncode,
        "loader_summary": proc.stdout.strip().splitlines()[-3:],
        "loader_progress_tail": proc.stderr.strip()[-400:],
        "environment": environment_info(),
    }
    out = write_result("loader", result)
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=2))
    print(f"written to {out}")
    ok = proc.returncode == 0 and not (missing_docs or missing_chunks or duplicated)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
