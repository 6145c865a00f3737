"""What the audit log's writer pays per record, a fresh SQLite file against a big one.

The gateway's writer thread inserts the audit records of searches in batches
(``batch_ingest.audit_store.AuditStore.insert``). This inserts ``--batches`` batches of
``--batch-size`` search records (20 doc ids and 30 chunk ids each, as a ``top_k`` 30 answer
records) into a fresh file and into a copy of ``--big`` (by default this checkout's
``var/audit.db``, the log the benchmarks have been writing), alternating for ``--rounds``,
and reports the writer thread's CPU and wall milliseconds per record (medians over the
batches). The copy is written, never the original.

    .venv/bin/python -m bench.bench_audit_writes --big var/audit.db
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from batch_ingest.audit_store import AuditRecord, AuditStore
from bench.common import REPO_ROOT, environment_info, markdown_table, setup_logging, write_result


def records(n: int, first: int) -> list[AuditRecord]:
    """``n`` records of allowed searches by four agents of one team."""
    return [
        AuditRecord(
            action="search",
            decision="allow",
            reason="granted",
            http_status=200,
            subject=f"agent{(first + i) % 4}",
            agent_id=f"agent{(first + i) % 4}",
            team_id="t_bench",
            resource="team:t_bench",
            query_sha256="ab" * 32,
            query_text="which tool edits photos and videos on the desktop",
            doc_ids=[f"d{j}" for j in range(20)],
            chunk_ids=[f"c{j}" for j in range(30)],
            latency_ms=9.5,
            path="/rag/search_docs",
        )
        for i in range(n)
    ]


def insert_pass(path: Path, batches: int, size: int) -> dict[str, float]:
    """Median CPU and wall ms per record of ``batches`` inserts into the file at ``path``."""
    store = AuditStore(f"sqlite:///{path}")
    store.create()
    store.insert(records(size, 0))  # connection and statement warm
    cpu, wall = [], []
    for b in range(batches):
        batch = records(size, b * size)
        c0, w0 = time.thread_time(), time.perf_counter()
        store.insert(batch)
        cpu.append((time.thread_time() - c0) / size * 1000)
        wall.append((time.perf_counter() - w0) / size * 1000)
    store.dispose()
    return {"cpu_ms": statistics.median(cpu), "wall_ms": statistics.median(wall)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    big = Path(args.big)
    if not big.exists():
        raise SystemExit(f"--big {big}: no such file (an audit log to copy)")
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        fresh, copy = Path(tmp) / "fresh.db", Path(tmp) / "big.db"
        shutil.copy(big, copy)
        passes = []
        for r in range(args.rounds):
            for name, path in (("fresh", fresh), ("big", copy)):
                out = insert_pass(path, args.batches, args.batch_size)
                passes.append({"round": r, "log": name, **out})
    return {"big_bytes": big.stat().st_size, "passes": passes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_audit_writes", description=__doc__)
    p.add_argument("--big", default=str(REPO_ROOT / "var" / "audit.db"))
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    setup_logging(args.verbose)
    result = {"benchmark": "audit_writes", "args": vars(args), "environment": environment_info()}
    result |= run(args)
    rows = [
        [x["round"], x["log"], f"{x['cpu_ms']:.4f}", f"{x['wall_ms']:.4f}"]
        for x in result["passes"]
    ]
    result["table_markdown"] = markdown_table(
        ["round", "log", "CPU ms / record", "wall ms / record"], rows
    )
    path = write_result("audit_writes", result, args.out)
    print(f"big log: {result['big_bytes'] / 1e6:.0f} MB")
    print(result["table_markdown"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
