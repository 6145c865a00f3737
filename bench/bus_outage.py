"""The bus through a long Milvus outage and past a large document (issue 34's targets), on
private services, with the consumer as its own process, as a platform engineer would run it.

    .venv/bin/python -m bench.bus_outage                      # 10-minute outage (~16 min)
    .venv/bin/python -m bench.bus_outage --outage-s 120       # a shorter one

Starts a private Milvus Lite server, Neo4j and nats-server (with its nkey users) in a
temporary ``RAG_VAR_DIR`` on their own ports (``bench.fault_run.Services``), issues a
producer credential for one team, and starts ``python -m batch_ingest.consumer`` with its
audit log in a SQLite file. Real text: KJV verses, five consecutive verses per document
(one chunk each), and one ~900 KB document of whole KJV chapters.

1. ``flow``: 100 ``doc.upserted`` events in the producer's name: 20 before the outage, then
   Milvus is stopped (``scripts/services.py down --only milvus``) for ``--outage-s`` while the
   other 80 are published evenly across it, then started again. Recorded: events
   dead-lettered, the time from Milvus answering again to the first and to the last
   ``indexed`` notice, notices per event (exactly once), each document's chunks in Milvus
   against its chunk count (no loss, no duplicate), and the audit log's ``bus.events``
   records (one per message).
2. ``large``: the ~900 KB document, then at once a small event; the seconds from publishing
   to each one's ``indexed`` notice (the small one must not wait behind the large one).

Writes ``bench/results/bus-outage-<UTC time>.json`` and prints a summary. Everything it
started is stopped in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from batch_ingest.bus_auth import BusAuth, connect_options, reload_server
from batch_ingest.event_types import event_subject, notice_subject
from bench.common import setup_logging, write_result
from bench.fault_run import Bus, Services
from bench.realtext import kjv_chapters, kjv_documents

logger = logging.getLogger("bench.bus_outage")
PRODUCER = "bench-outage"


def flow_documents(team: str, n: int, per_doc: int = 5) -> list[dict[str, Any]]:
    verses = kjv_documents(team, limit=n * per_doc)
    docs = []
    for i in range(n):
        group = verses[i * per_doc : (i + 1) * per_doc]
        docs.append(
            {
                "doc_id": f"flow-{i:03d}",
                "title": group[0]["title"],
                "text": " ".join(v["text"] for v in group),
            }
        )
    return docs


def large_document(target_bytes: int) -> dict[str, Any]:
    parts: list[str] = []
    size = 0
    for chapter in kjv_chapters("x"):
        parts.append(f"{chapter['title']}. {chapter['text']}")
        size += len(parts[-1].encode()) + 2
        if size >= target_bytes:
            break
    return {"doc_id": "large-kjv", "title": "KJV, Genesis onwards", "text": "\n\n".join(parts)}


class Publisher:
    """The producer's own connection (its credential, its name on every subject) and the
    operator's subscription to the team's ``indexed`` notices."""

    def __init__(self, bus: Bus, seed: Path) -> None:
        self.bus = bus
        self.seed = seed
        self.nc: Any = None
        self.indexed: dict[str, list[float]] = {}  # event_id -> notice times
        self.chunks: dict[str, int] = {}  # doc_id -> chunks of its last notice

    async def start(self) -> None:
        import nats

        self.nc = await nats.connect(
            self.bus.url,
            name=PRODUCER,
            max_reconnect_attempts=-1,
            **connect_options(self.seed, inbox_prefix=f"_INBOX.{PRODUCER}"),
        )

        async def on_notice(msg: Any) -> None:
            body = json.loads(msg.data)
            self.indexed.setdefault(body["event_id"], []).append(time.monotonic())
            self.chunks[body["doc_id"]] = body["chunks"]

        subject = notice_subject(self.bus.team, "indexed", self.bus.prefix)
        await self.bus.nc.subscribe(subject, cb=on_notice)
        await self.bus.nc.flush()

    async def publish(self, doc: dict[str, Any]) -> tuple[str, float]:
        event = self.bus.event(doc, uuid.uuid4().hex)
        subject = event_subject(self.bus.team, "doc.upserted", self.bus.prefix, producer=PRODUCER)
        await self.nc.jetstream().publish(
            subject,
            json.dumps(event).encode(),
            headers={"Nats-Msg-Id": event["event_id"]},
            timeout=10,
        )
        return event["event_id"], time.monotonic()

    async def wait(self, event_ids: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(e in self.indexed for e in event_ids):
                return True
            await asyncio.sleep(0.2)
        return False

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()


async def milvus_answers(store: Any, timeout_s: float = 300.0) -> float:
    """Monotonic time at which Milvus answers a read again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            await asyncio.to_thread(store.conn.start, check=True)
            return time.monotonic()
        except Exception:
            await asyncio.sleep(0.2)
    raise TimeoutError("Milvus did not answer after its restart")


async def flow(
    args: argparse.Namespace, services: Services, bus: Bus, pub: Publisher, store: Any
) -> dict[str, Any]:
    docs = flow_documents(bus.team, args.events)
    before, during = docs[: args.before], docs[args.before :]
    published: dict[str, str] = {}  # event_id -> doc_id
    for doc in before:
        event_id, _ = await pub.publish(doc)
        published[event_id] = doc["doc_id"]
    if not await pub.wait(list(published), 180):
        raise RuntimeError(f"the first events were not indexed: {bus.log_tail()}")
    logger.info("%d events indexed; stopping Milvus for %.0f s", len(before), args.outage_s)
    down = await services.run("down", "milvus", 120)
    t_down = time.monotonic()
    gap = args.outage_s / max(len(during), 1)
    for doc in during:
        event_id, _ = await pub.publish(doc)
        published[event_id] = doc["doc_id"]
        await asyncio.sleep(
            max(0.0, t_down + gap * (len(published) - len(before)) - time.monotonic())
        )
    await asyncio.sleep(max(0.0, t_down + args.outage_s - time.monotonic()))
    indexed_in_outage = sum(e in pub.indexed for e in list(published)[len(before) :])
    up = await services.run("up", "milvus", 300)
    t_back = await milvus_answers(store)
    logger.info("Milvus back after %.0f s of outage; waiting for the backlog", t_back - t_down)
    drained = await pub.wait(list(published), args.drain_timeout_s)
    late = [e for e in list(published)[len(before) :] if e in pub.indexed]
    firsts = [min(pub.indexed[e]) - t_back for e in late]
    js = bus.nc.jetstream()
    dlq = (await js.stream_info(f"{bus.stream}_DLQ")).state.messages
    per_doc = {}
    for event_id, doc_id in published.items():
        got = await asyncio.to_thread(store.get_chunks, bus.team, "doc", doc_id)
        ids = [c.chunk_id for c in got]
        per_doc[doc_id] = {
            "in_milvus": len(ids),
            "distinct": len(set(ids)),
            "notice_chunks": pub.chunks.get(doc_id),
            "notices": len(pub.indexed.get(event_id, [])),
        }
    exact = all(
        d["notices"] == 1 and d["in_milvus"] == d["distinct"] == d["notice_chunks"]
        for d in per_doc.values()
    )
    return {
        "events": len(published),
        "published_during_outage": len(during),
        "outage_s": round(t_back - t_down, 1),
        "milvus_down": down,
        "milvus_up": up,
        "indexed_during_outage": indexed_in_outage,
        "all_indexed": drained,
        "dead_lettered": dlq,
        "first_after_recovery_s": round(min(firsts), 2) if firsts else None,
        "last_after_recovery_s": round(max(firsts), 2) if firsts else None,
        "exactly_once": exact,
        "chunks_total": sum(d["in_milvus"] for d in per_doc.values()),
        "not_exact": {k: v for k, v in per_doc.items() if v["notices"] != 1} if not exact else {},
    }


async def large(args: argparse.Namespace, bus: Bus, pub: Publisher) -> dict[str, Any]:
    big = large_document(args.large_bytes)
    small = {"doc_id": "small-after-large", "title": "Psalm 23", "text": kjv_psalm_23()}
    big_id, t_big = await pub.publish(big)
    small_id, t_small = await pub.publish(small)
    await pub.wait([small_id], 120)
    await pub.wait([big_id], args.drain_timeout_s)
    return {
        "large_bytes": len(big["text"].encode()),
        "large_chunks": pub.chunks.get(big["doc_id"]),
        "small_indexed_s": round(pub.indexed[small_id][0] - t_small, 2)
        if small_id in pub.indexed
        else None,
        "large_indexed_s": round(pub.indexed[big_id][0] - t_big, 2)
        if big_id in pub.indexed
        else None,
    }


def kjv_psalm_23() -> str:
    (chapter,) = [c for c in kjv_chapters("x") if c["doc_id"] == "kjv-Psalms.23"]
    return chapter["text"]


async def audit_records(url: str) -> dict[str, Any]:
    from batch_ingest.audit_store import AuditStore

    rows = await asyncio.to_thread(AuditStore(url).query, limit=100_000, action="bus.events")
    return {
        "records": len(rows),
        "allow": sum(r["decision"] == "allow" for r in rows),
        "producers": sorted({r["subject"] for r in rows}),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from batch_ingest.settings import BatchSettings
    from deployments.models.embedding import embedding_dim
    from deployments.vector_store.store import MilvusStore

    folder = Path(tempfile.mkdtemp(prefix="bench_bus_outage_", dir="/tmp"))
    services = Services(private=True)
    assert services.var is not None
    os.environ["RAG_VAR_DIR"] = str(services.var)  # the consumer's and operators' seeds
    audit_url = f"sqlite:///{folder}/audit.db"
    os.environ["AUDIT__URL"] = audit_url
    settings = BatchSettings(
        milvus={"uri": services.url("milvus"), "collection": "bench_bus_outage"},
        neo4j={"uri": services.url("neo4j")},
        state={"url": f"sqlite:///{folder}/state.db"},
    )
    team = f"bench_bus_{uuid.uuid4().hex[:6]}"
    bus = Bus(services.url("nats"), settings, folder, team)
    pub: Publisher | None = None
    result: dict[str, Any] = {"outage_s_asked": args.outage_s, "team": team}
    try:
        services.start_private(["milvus", "neo4j", "nats"])
        auth = BusAuth(services.var / "nats" / "auth")
        seed = auth.issue(PRODUCER, [team], bus.prefix)
        reload_server(services.var / "nats.pid")
        result["consumer_start_s"] = round(await bus.start(), 1)
        pub = Publisher(bus, seed)
        await pub.start()
        store = MilvusStore(settings.milvus, dim=embedding_dim(settings.embedder))
        result["flow"] = await flow(args, services, bus, pub, store)
        logger.info("flow: %s", result["flow"])
        result["large"] = await large(args, bus, pub)
        logger.info("large: %s", result["large"])
        result["audit"] = await audit_records(audit_url)
        result["published"] = args.events + 2
    finally:
        if pub is not None:
            await pub.close()
        result["consumer"] = await bus.stop()
        services.restore_all()
        services.stop_private()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outage-s", type=float, default=600.0)
    p.add_argument("--events", type=int, default=100)
    p.add_argument("--before", type=int, default=20, help="events published before the outage")
    p.add_argument("--large-bytes", type=int, default=900_000)
    p.add_argument("--drain-timeout-s", type=float, default=600.0)
    args = p.parse_args(argv)
    setup_logging()
    result = asyncio.run(run(args))
    path = write_result("bus-outage", result)
    print(json.dumps({k: v for k, v in result.items() if k != "consumer"}, indent=2))
    print(f"written to {path}")
    ok = result.get("flow", {}).get("exactly_once") and not result["flow"]["dead_lettered"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
