"""Searches during a reindex started over HTTP, on the shipped one-machine setup (issue 33).

    .venv/bin/python -m bench.reindex_probe --chapters 150 --idle-s 30

The gateway on a private local Ray of 2 CPUs (what scripts/start.sh gives Ray), the shipped
deployments and reindex pool; one team of the first ``--chapters`` King James chapters
(Debian ``sword-text-kjv``, real text, ingested over HTTP). A searcher asks every 0.2 s, in
turn, one of ``--queries`` real verses (later chapters' verses: real sentences the team does
not contain word for word), top 5 (graph off: the app has no Graph):

1. idle, for ``--idle-s``: the baseline latency and each query's answer;
2. ``POST /admin/reindex`` (model unchanged: the job copies vectors), searching on until the
   job succeeded and ``--after-s`` more.

``--model-change``: before the idle phase the team's live rows are tagged as another model's
(their vectors stay those of the current model, so searches stay meaningful), and the job
embeds every chunk again, as after a change of model, with ``reindex.torch_threads``
(``--threads``; 0, the default, is every core).

Reported: the job's wall time and chunks/s (its own figures), errors, search p50/p95/max idle
vs during the job (and the ratio), and answers that are neither the old version's settled
answer to the same query (its last idle answer) nor the new one's (its last answer after the
job), with the phase the job was in.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from typing import Any

import httpx

from bench.common import setup_logging, write_result
from bench.quality.bible_set import KJV_MODULE, export_module
from bench.realtext import kjv_chapters
from bench.serve_harness import ServeHarness

logger = logging.getLogger("bench.reindex_probe")
TEAM = "bench_reindex_probe"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else 0.0


class Searcher(threading.Thread):
    def __init__(self, base: str, queries: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base, timeout=30)
        self.queries = queries
        self.phase = "idle"
        self.records: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            query = self.queries[i % len(self.queries)]
            body = {"team_id": TEAM, "query": query, "top_k": 5}
            phase = self.phase
            started = time.perf_counter()
            try:
                r = self.client.post("/rag/search_docs", json=body)
                ok = r.status_code == 200
                ids = [m["source_ref"]["id"] for m in r.json().get("matches", [])] if ok else []
                status = r.status_code
                timing = r.headers.get("server-timing", "")
            except httpx.HTTPError as exc:
                ok, ids, status, timing = False, [], str(exc), ""
            ms = (time.perf_counter() - started) * 1000
            self.records.append(
                {
                    "i": i,
                    "query": i % len(self.queries),
                    "phase": phase,
                    "ms": ms,
                    "ok": ok,
                    "status": status,
                    "ids": ids,
                    "at": time.time(),
                    "server_timing": timing,
                }
            )
            i += 1
            time.sleep(0.2)


def retag(h: ServeHarness, tag: str) -> int:
    """Tag the team's live rows with ``tag`` (vectors kept): the next reindex embeds them."""
    from dataclasses import replace

    store = h.milvus_store()
    versions = store.versions
    physical = versions.name(TEAM, versions.current(TEAM))
    ids = [
        row["chunk_id"]
        for row in store.conn.client.query(
            physical, filter="", output_fields=["chunk_id"], limit=16_000
        )
    ]
    rows = [replace(c, embed_model=tag) for c in versions.fetch_rows(physical, ids)]
    for start in range(0, len(rows), 256):
        versions.upsert(physical, rows[start : start + 256])
    versions.flush(physical)
    store.close()
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chapters", type=int, default=150)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--after-s", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--model-change", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="reindex.torch_threads")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    setup_logging()
    docs = kjv_chapters(TEAM, args.chapters)
    verses = list(export_module(KJV_MODULE).values())
    queries = [v for v in verses[-20_000::500]][: args.queries]
    result: dict[str, Any] = {
        "data": f"KJV chapters 1-{len(docs)}; {len(queries)} later verses as queries",
    }
    result["model_change"] = args.model_change
    result["torch_threads"] = args.threads
    with ServeHarness(
        port=args.port,
        collection="bench_reindex_probe",
        graph_enabled=False,
        num_cpus=2,
        settings={"reindex": {"torch_threads": args.threads}},
    ) as h:
        client = httpx.Client(base_url=h.url(""), timeout=300)
        # Small requests: each is indexed before it is answered (a request over
        # ingest.sync_max_chars would become a background job, still running when the idle
        # phase starts).
        for start in range(0, len(docs), 10):
            r = client.post("/ingest/documents", json={"documents": docs[start : start + 10]})
            r.raise_for_status()
            assert r.status_code == 200, r.text
        logger.info("ingested %d chapters", len(docs))
        if args.model_change:
            logger.info("tagged %d rows as another model's", retag(h, "all-MiniLM-L6-v2@old"))
        searcher = Searcher(h.url(""), queries)
        searcher.start()
        time.sleep(args.idle_s)
        searcher.phase = "queued"
        started = time.perf_counter()
        started_at = time.time()
        progress: list[dict[str, Any]] = []
        r = client.post("/admin/reindex", json={"team_id": TEAM})
        r.raise_for_status()
        job_id = r.json()["job_id"]
        while True:
            job = client.get(f"/admin/reindex/{job_id}").json()
            searcher.phase = job["status"]
            seen = (job["status"], job.get("written_chunks"))
            if not progress or (progress[-1]["status"], progress[-1]["written_chunks"]) != seen:
                progress.append(
                    {
                        "t_s": round(time.time() - started_at, 2),
                        "status": job["status"],
                        "written_chunks": job.get("written_chunks"),
                    }
                )
            if job["status"] not in ("queued", "running", "switching"):
                break
            time.sleep(0.1)
        result["job_wall_s"] = round(time.perf_counter() - started, 1)
        searcher.phase = "after"
        time.sleep(args.after_s)
        searcher.stop.set()
        searcher.join(30)
    result["job"] = {
        k: job.get(k)
        for k in (
            "status",
            "total_docs",
            "expected_chunks",
            "rows_in_target",
            "written_chunks",
            "rate_chunks_s",
            "error",
            "note",
        )
    }
    result["job_progress"] = progress
    result["job_chunks_per_s"] = round((job.get("expected_chunks") or 0) / result["job_wall_s"], 1)
    records = searcher.records
    idle = [r for r in records if r["phase"] == "idle" and r["ok"]]
    during = [r for r in records if r["phase"] != "idle"]
    # Each query's settled answer from the old version (its last idle answer: the first ones
    # may come from Milvus while the replica loads the team, which ranks a little
    # differently) and from the new one (its last answer after the job).
    old_answer = {r["query"]: r["ids"] for r in idle}
    new_answer = {r["query"]: r["ids"] for r in during if r["phase"] == "after" and r["ok"]}
    differing = [
        {
            "phase": r["phase"],
            "query": r["query"],
            "got": r["ids"],
            "old": old_answer[r["query"]],
            "new": new_answer.get(r["query"]),
        }
        for r in during
        if r["ok"]
        and r["query"] in old_answer
        and r["ids"] not in (old_answer[r["query"]], new_answer.get(r["query"]))
    ]
    result["old_equals_new"] = (
        sum(1 for q, ids in new_answer.items() if old_answer.get(q) == ids),
        len(new_answer),
    )
    idle_ms = [r["ms"] for r in idle]
    during_ms = [r["ms"] for r in during if r["ok"]]
    result["searches"] = {
        "idle": {
            "n": len(idle),
            "p50_ms": pct(idle_ms, 0.5),
            "p95_ms": pct(idle_ms, 0.95),
            "max_ms": round(max(idle_ms), 1),
        },
        "during": {
            "n": len(during),
            "p50_ms": pct(during_ms, 0.5),
            "p95_ms": pct(during_ms, 0.95),
            "max_ms": round(max(during_ms), 1),
        },
        "errors": [r["status"] for r in records if not r["ok"]],
        "differing_from_idle": differing[:20],
        "differing_count": len(differing),
        # The slowest searches from the job's start, with the gateway's Server-Timing header.
        "slowest_during": [
            {
                "t_s": round(r["at"] - r["ms"] / 1000 - started_at, 2),
                "phase": r["phase"],
                "ms": round(r["ms"], 1),
                "server_timing": r["server_timing"],
            }
            for r in sorted(during, key=lambda r: -r["ms"])[:8]
        ],
        "by_phase": {
            phase: {
                "n": len(rs),
                "p50_ms": pct([r["ms"] for r in rs], 0.5),
                "max_ms": round(max(r["ms"] for r in rs), 1),
            }
            for phase in ("queued", "running", "switching", "succeeded", "after")
            if (rs := [r for r in during if r["phase"] == phase and r["ok"]])
        },
    }
    s = result["searches"]
    s["p50_ratio"] = round(s["during"]["p50_ms"] / s["idle"]["p50_ms"], 2)
    print(
        f"job {result['job']['status']} in {result['job_wall_s']} s "
        f"({result['job']['expected_chunks']} chunks, {result['job_chunks_per_s']} chunks/s); "
        f"searches idle p50 {s['idle']['p50_ms']} ms max {s['idle']['max_ms']} ms, during "
        f"p50 {s['during']['p50_ms']} ms max {s['during']['max_ms']} ms (p50 ×{s['p50_ratio']}); "
        f"errors {len(s['errors'])}; answers neither version gives {s['differing_count']}"
    )
    print("by phase:", s["by_phase"], "median idle", statistics.median(idle_ms))
    write_result("reindex_probe", result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
