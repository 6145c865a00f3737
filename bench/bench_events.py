"""Event → searchable latency through NATS JetStream and the bus consumer.

    .venv/bin/python -m bench.bench_events                    # 200 events at 5/s, then a burst
    .venv/bin/python -m bench.bench_events --events 200 --rate 0   # burst only

Needs the running nats-server, Milvus Lite server and Neo4j (``scripts/services.py status``).
Starts ``python -m batch_ingest.consumer`` as its own process (Milvus collection
``bench_events``, its own SQLite registry under /tmp, stream ``BENCH_EVENTS`` with the subject
prefix ``bench.``), waits until it listens, publishes ``doc.upserted`` events (one ~40-word
chunk each, fresh document ids) stamped with the publish time, and takes for each event the
time until its ``rag.team.<team>.document.indexed`` notification arrives (sent after the
Milvus upsert, so the document is searchable then; one search per phase checks that).
Phases: ``paced`` (open loop at ``--rate`` events/s) and ``burst`` (all published at once:
throughput). The consumer is stopped with SIGTERM (graceful: it must exit 0), then the
stream, the collection, the tenant's Neo4j nodes and the registry are removed. Result JSON
in bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from batch_ingest.bus_auth import local_options
from batch_ingest.event_types import event_subject, notice_subject
from bench.common import REPO_ROOT, latency_summary, logger, setup_logging, write_result

COLLECTION = "bench_events"
TEAM = "bench_events_t00"
STREAM = "BENCH_EVENTS"
PREFIX = "bench."
WORDS = [
    "solar",
    "battery",
    "grid",
    "cooperative",
    "tomato",
    "batch",
    "ledger",
    "audit",
    "channel",
    "project",
    "harvest",
    "invoice",
    "shipment",
    "warehouse",
    "sensor",
    "irrigation",
    "compost",
    "market",
    "token",
    "vote",
    "proposal",
]


def make_event(i: int, run: str) -> dict[str, Any]:
    rng = random.Random(i)
    text = " ".join(rng.choice(WORDS) for _ in range(40))
    return {
        "event_id": f"{run}-{i}",
        "ts": int(time.time() * 1000),
        "domain": "doc",
        "type": "doc.upserted",
        "version": "1.0",
        "actor": {"id": "u_bench", "kind": "user"},
        "payload": {"doc_id": f"{run}-d{i}", "title": f"bench {i}", "text": text, "revision": 1},
        "meta": {"team_id": TEAM, "trace_id": run},
    }


async def phase(js, nc, name: str, n: int, rate: float, run: str, start: int) -> dict[str, Any]:
    sent: dict[str, float] = {}
    done: dict[str, float] = {}
    finished = asyncio.Event()

    async def on_indexed(msg) -> None:
        note = json.loads(msg.data)
        if note["event_id"] in sent:
            done[note["event_id"]] = time.perf_counter()
            if len(done) == n:
                finished.set()

    sub = await nc.subscribe(notice_subject(TEAM, "indexed", PREFIX), cb=on_indexed)
    t0 = time.perf_counter()
    for k in range(n):
        ev = make_event(start + k, run)
        if rate > 0:
            delay = t0 + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        sent[ev["event_id"]] = time.perf_counter()
        await js.publish(
            event_subject(TEAM, "doc.upserted", PREFIX),
            json.dumps(ev).encode(),
            headers={"Nats-Msg-Id": ev["event_id"]},
        )
    try:
        await asyncio.wait_for(finished.wait(), timeout=max(120.0, n * 1.0))
    except TimeoutError:
        logger.warning("%s: only %d/%d indexed before the timeout", name, len(done), n)
    wall = time.perf_counter() - t0
    await sub.unsubscribe()
    lat = [done[e] - sent[e] for e in done]
    summary = latency_summary(lat)
    summary |= {
        "phase": name,
        "events": n,
        "indexed": len(done),
        "rate_target": rate or None,
        "wall_s": round(wall, 2),
        "throughput_eps": round(len(done) / wall, 2) if wall else None,
    }
    logger.info("%s: %s", name, summary)
    return summary


async def main_async(args: argparse.Namespace) -> int:
    import nats

    from batch_ingest.consumer import ConsumerSettings, ensure_stream

    run = uuid.uuid4().hex[:6]
    tmp = Path(tempfile.mkdtemp(prefix="bench_events_"))
    env = {
        **os.environ,
        "MILVUS__COLLECTION": COLLECTION,
        "STATE__URL": f"sqlite:///{tmp}/state.db",
        "PYTHONPATH": str(REPO_ROOT),
    }
    nc = await nats.connect(args.url, **local_options())
    js = nc.jetstream()
    cfg = ConsumerSettings(url=args.url, stream=STREAM, durable="bench", subject_prefix=PREFIX)
    for name in (STREAM, cfg.dlq_stream):  # a stream left by a killed run
        with contextlib.suppress(Exception):
            await js.delete_stream(name)
    await ensure_stream(js, cfg)
    log = open(tmp / "consumer.log", "wb")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_ingest.consumer", "--url", args.url, "--stream", STREAM]
        + ["--durable", "bench", "--subject-prefix", PREFIX, "--batch", str(args.batch)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    results: list[dict[str, Any]] = []
    exit_code: Any = None
    searchable = None
    try:
        # Warm-up: the consumer is ready when one event comes back indexed.
        t = time.perf_counter()
        warm = await phase(js, nc, "warmup", 1, 0, run, 10_000_000)
        if not warm["indexed"]:
            raise SystemExit(f"consumer never indexed the warm-up event; log: {tmp}/consumer.log")
        logger.info("consumer ready after %.1f s", time.perf_counter() - t)
        if args.rate > 0:
            results.append(await phase(js, nc, "paced", args.events, args.rate, run, 0))
        results.append(await phase(js, nc, "burst", args.events, 0, run, 1_000_000))
        # Searchable check: a BM25 search for one indexed document's title finds it.
        from deployments.protocols import SearchFilter
        from deployments.vector_store.store import MilvusStore
        from serve_app.settings import GatewaySettings

        settings = GatewaySettings(milvus={"collection": COLLECTION})
        store = MilvusStore(settings.milvus, dim=384)
        hits = store.search(
            make_event(1_000_003, run)["payload"]["text"],
            None,
            SearchFilter(team_id=TEAM),
            5,
            "bm25",
        )
        searchable = any(h.chunk.doc_id == f"{run}-d1000003" for h in hits)
        logger.info("searchable check: %s; chunks stored %d", searchable, store.count(TEAM))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            exit_code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            exit_code = "killed"
        log.close()
        for name in (STREAM, cfg.dlq_stream):
            with contextlib.suppress(Exception):
                await js.delete_stream(name)
        await nc.close()
        try:
            from deployments.vector_store.store import MilvusStore
            from serve_app.settings import GatewaySettings

            store = MilvusStore(GatewaySettings(milvus={"collection": COLLECTION}).milvus, dim=384)
            store.drop()
            from neo4j import GraphDatabase

            s = GatewaySettings()
            with GraphDatabase.driver(s.neo4j.uri, auth=(s.neo4j.user, s.neo4j.password)) as d:
                d.execute_query("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": TEAM})
        except Exception as exc:
            logger.warning("cleanup: %s", exc)
    logger.info("consumer exited with %s after SIGTERM", exit_code)
    payload = {
        "args": vars(args),
        "phases": results,
        "consumer_exit": exit_code,
        "searchable_check": searchable,
        "loadavg": os.getloadavg(),
    }
    path = write_result("bench_events", payload, args.out)
    if exit_code == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| phase | events | rate (ev/s) | p50 ms | p95 ms | max ms | throughput ev/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['phase']} | {r['indexed']}/{r['events']} | {r['rate_target'] or 'burst'} "
            f"| {r.get('p50_ms')} | {r.get('p95_ms')} | {r.get('max_ms')} "
            f"| {r['throughput_eps']} |"
        )
    logger.info("result: %s", path)
    return 0 if exit_code == 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="nats://127.0.0.1:4222")
    p.add_argument("--events", type=int, default=200, help="events per phase")
    p.add_argument("--rate", type=float, default=5.0, help="paced phase rate; 0 = burst only")
    p.add_argument("--batch", type=int, default=16, help="consumer fetch batch")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    setup_logging()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
