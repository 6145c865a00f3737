"""One fault at a time under steady load: does the gateway answer clearly, within its
deadlines, and recover by itself? Run by hand (it stops services other work may be using).

The gateway runs on a private Ray cluster (``bench.serve_harness``; JWT auth, the graph on,
the semantic cache in Redis when ``redis`` is among the faults) under ``bench.bench_load``'s
open-loop mixed traffic at ``--rate`` (default 3 req/s). Then, one after the other
(``--faults``, default all):

* ``milvus``: ``scripts/services.py down --only milvus`` … ``up --only milvus``. During the
  outage one ingest of a new KJV chapter is sent (expected: 503 naming Milvus); after the
  recovery the same request is retried until it is acknowledged, and the document's chunks in
  Milvus must be exactly its chunks, once.
* ``neo4j``: the same with Neo4j (graph intents, explain_path, graph-boosted searches, the
  ingests' graph writes).
* ``redis``: the same with Redis (the cache; searches must go on uncached).
* ``nats``: the gateway itself does not use the bus; ``batch_ingest.consumer`` is started as a
  subprocess on a stream of this run, an event is published and indexed before the fault,
  publishing is tried during it, and after the restart a new event must be published and
  indexed without restarting the consumer.
* ``embedder``: ``ray.kill`` of the Embedder replica actor (``no_restart=False``): Serve
  replaces it.

Each fault is held ``--outage-s`` (default 25 s), with a probe of the dependency's endpoint
every ``--probe-s`` besides the load. Recorded per fault: the time from the fault to the first
clear answer (a 503 naming the dependency, or a 200 whose ``degraded`` reason — for Redis
the ``cache.status`` — names it), the worst latency of the requests sent during the outage
against the bound the README's deadlines give each endpoint, the status codes seen (no 500),
the time from the restore to the first normal answer (a non-degraded 200; for Milvus an
uncached one), whether it recovered without a redeploy (nothing is redeployed: the first
normal answer within ``--recover-timeout-s`` and ``/readyz`` 200), and which replicas Serve
replaced meanwhile. Every wait is bounded; whatever was stopped is started again in a
``finally``. At the end the team's chunks are checked against every acknowledged ingest.

    .venv/bin/python -m bench.fault_run                         # all faults, shared services
    .venv/bin/python -m bench.fault_run --faults milvus,embedder
    .venv/bin/python -m bench.fault_run --private-services      # own Milvus/Neo4j/NATS/Redis

``--private-services`` starts the services with ``scripts/services.py`` in a temporary
``RAG_VAR_DIR`` on their own ports, so nothing else on the machine loses them; without it the
machine's shared services are stopped and started (make sure nothing else needs them then).
Writes ``bench/results/faults-<UTC time>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from batch_ingest.bus_auth import local_options
from batch_ingest.event_types import event_subject
from bench.bench_load import (
    DocState,
    LoadGenerator,
    Recorder,
    Sample,
    Workload,
    add_load_arguments,
    deadlines,
    harness_settings,
    parse_mix,
    parse_shares,
    prepare,
    serve_replicas,
    summarize,
    token,
    verify_chunks,
    warm_up,
)
from bench.common import REPO_ROOT, environment_info, markdown_table, setup_logging

logger = logging.getLogger("bench.faults")

SERVICES = REPO_ROOT / "scripts" / "services.py"
ALL_FAULTS = ("milvus", "neo4j", "redis", "nats", "embedder")
PRIVATE_PORTS = {"milvus": 19631, "neo4j": 7788, "nats": 4323, "redis": 6481}
PORT_ENV = {
    "milvus": "RAG_MILVUS_PORT",
    "neo4j": "RAG_NEO4J_PORT",
    "nats": "RAG_NATS_PORT",
    "redis": "RAG_REDIS_PORT",
}


@dataclass(frozen=True)
class FaultSpec:
    name: str
    # What a clear answer names (case-insensitive, in a 503's message or a degraded reason).
    names: str
    probe: str  # the kind probed every --probe-s
    # Kinds whose first normal answer after the restore counts as recovered.
    affected: tuple[str, ...]


SPECS = {
    "milvus": FaultSpec("milvus", r"milvus", "search", ("search", "enrich", "ingest")),
    "neo4j": FaultSpec("neo4j", r"neo4j|graph", "graph", ("graph", "path")),
    "redis": FaultSpec("redis", r"redis|cache", "search", ("search",)),
    # The bus is probed by publishing (FaultRunner.nats_outage); the HTTP probe is a search.
    "nats": FaultSpec("nats", r"nats", "search", ()),
    "embedder": FaultSpec("embedder", r"embed", "ingest", ("ingest",)),
}


# --- the services --------------------------------------------------------------------------


class Services:
    """``scripts/services.py`` for the machine's services, or for private ones in their own
    ``RAG_VAR_DIR`` and ports (``private``)."""

    def __init__(self, private: bool) -> None:
        self.private = private
        self.env = dict(os.environ)
        self.var: Path | None = None
        self.ports = {
            "milvus": int(os.environ.get("RAG_MILVUS_PORT", "19530")),
            "neo4j": int(os.environ.get("RAG_NEO4J_PORT", "7687")),
            "nats": int(os.environ.get("RAG_NATS_PORT", "4222")),
            "redis": int(os.environ.get("RAG_REDIS_PORT", "6380")),
        }
        if private:
            self.var = Path(tempfile.mkdtemp(prefix="bench_faults_var_", dir="/tmp"))
            self.env["RAG_VAR_DIR"] = str(self.var)
            self.env.setdefault("RAG_NEO4J_HEAP", "512m")
            self.env.setdefault("RAG_NEO4J_PAGECACHE", "64m")
            for name, port in PRIVATE_PORTS.items():
                self.ports[name] = port
                self.env[PORT_ENV[name]] = str(port)
        self.started: list[str] = []  # private services started by this run
        self.down_now: set[str] = set()  # stopped by a fault and not started again yet

    def url(self, name: str) -> str:
        port = self.ports[name]
        return {
            "milvus": f"http://127.0.0.1:{port}",
            "neo4j": f"bolt://127.0.0.1:{port}",
            "nats": f"nats://127.0.0.1:{port}",
            "redis": f"redis://127.0.0.1:{port}/0",
        }[name]

    def _argv(self, command: str, name: str) -> list[str]:
        return [sys.executable, str(SERVICES), command, "--only", name]

    def run_sync(self, command: str, name: str, timeout_s: float) -> dict[str, Any]:
        t0 = time.monotonic()
        proc = subprocess.run(
            self._argv(command, name),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        out = (proc.stdout + proc.stderr).strip().splitlines()
        return {"rc": proc.returncode, "s": round(time.monotonic() - t0, 2), "log": out[-4:]}

    async def run(self, command: str, name: str, timeout_s: float) -> dict[str, Any]:
        """``services.py <command> --only <name>`` without blocking the event loop (the load
        goes on); bounded by ``timeout_s``."""
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self._argv(command, name),
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        rc: int | str | None
        try:
            raw, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
            rc = proc.returncode
        except TimeoutError:
            proc.kill()
            raw, rc = b"", "timeout"
        if command == "down":
            self.down_now.add(name)
        elif command == "up" and rc == 0:
            self.down_now.discard(name)
        lines = raw.decode(errors="replace").strip().splitlines()
        return {"rc": rc, "s": round(time.monotonic() - t0, 2), "log": lines[-4:]}

    def start_private(self, names: list[str]) -> None:
        for name in names:
            logger.info("starting a private %s on port %d", name, self.ports[name])
            res = self.run_sync("up", name, 300)
            if res["rc"] != 0:
                raise RuntimeError(f"private {name} did not start: {res}")
            self.started.append(name)
            if name == "neo4j":
                self.create_graph_schema()

    def create_graph_schema(self) -> None:
        """The graph schema on a fresh private Neo4j, before the gateway starts: created by
        the Graph replica's first connection instead, on 2 busy cores, a bootstrap cut off by
        a caller's deadline can leave an orphan index behind (the report's finding)."""
        from neo4j import GraphDatabase

        from deployments.graph_store.cypher import schema_statements

        password = self.env.get("NEO4J__PASSWORD", "rag-gateway-dev")
        with GraphDatabase.driver(self.url("neo4j"), auth=("neo4j", password)) as driver:
            for statement in schema_statements():
                driver.execute_query(statement)
        logger.info("created the graph schema on the private Neo4j")

    def restore_all(self) -> None:
        """Start again every service a fault stopped (the ``finally`` of the run)."""
        for name in sorted(self.down_now):
            logger.warning("restoring %s", name)
            try:
                res = self.run_sync("up", name, 300)
                logger.info("restored %s: %s", name, res)
                if res["rc"] == 0:
                    self.down_now.discard(name)
            except Exception:
                logger.exception("could not restore %s: start it with scripts/services.py", name)

    def stop_private(self) -> None:
        for name in reversed(self.started):
            with contextlib.suppress(Exception):
                self.run_sync("down", name, 120)
        self.started.clear()
        if self.var is not None:
            shutil.rmtree(self.var, ignore_errors=True)


# --- the bus (the nats fault) ----------------------------------------------------------------


class Bus:
    """A ``batch_ingest.consumer`` subprocess on this run's stream, and a publisher."""

    def __init__(self, url: str, settings: Any, folder: Path, team: str) -> None:
        tag = secrets.token_hex(3)
        self.url = url
        self.stream = f"BENCH_FAULTS_{tag.upper()}"
        self.durable = f"bench-faults-{tag}"
        self.prefix = f"bench_faults_{tag}."
        self.team = team
        self.settings = settings
        self.log_path = folder / f"consumer-{tag}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.nc: Any = None
        self.js: Any = None

    async def start(self, timeout_s: float = 240.0) -> float:
        s = self.settings
        env = {
            **os.environ,
            "MILVUS__URI": s.milvus.uri,
            "MILVUS__COLLECTION": s.milvus.collection,
            "NEO4J__URI": s.neo4j.uri,
            "NEO4J__USER": s.neo4j.user,
            "NEO4J__PASSWORD": s.neo4j.password,
            "STATE__URL": s.state.url,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        argv = [
            sys.executable,
            "-m",
            "batch_ingest.consumer",
            "--url",
            self.url,
            "--stream",
            self.stream,
            "--durable",
            self.durable,
            "--subject-prefix",
            self.prefix,
            "--backoff",
            "2,5,10,20",
        ]
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the consumer exited: {self.log_tail()}")
            if "consuming" in self.log_path.read_text(errors="replace"):
                break
            await asyncio.sleep(1.0)
        else:
            raise TimeoutError(f"the consumer did not start in {timeout_s:.0f}s: {self.log_tail()}")
        import nats

        async def quiet(exc: Exception) -> None:  # reconnect attempts while NATS is down
            logger.debug("publisher: %r", exc)

        self.nc = await nats.connect(
            self.url,
            name="bench-faults-publisher",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=2,
            error_cb=quiet,
            **local_options(),
        )
        self.js = self.nc.jetstream()
        took = time.monotonic() - t0
        logger.info("consumer pid %d consuming %s after %.1fs", self.proc.pid, self.stream, took)
        return took

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def event(self, doc: dict[str, Any], event_id: str) -> dict[str, Any]:
        payload = {k: v for k, v in doc.items() if k not in ("team_id",)}
        payload["revision"] = 1
        return {
            "event_id": event_id,
            "ts": int(time.time() * 1000),
            "domain": "doc",
            "type": "doc.upserted",
            "version": "1.0",
            "actor": {"id": "user_bench_faults", "kind": "user"},
            "payload": payload,
            "meta": {"team_id": self.team, "trace_id": uuid.uuid4().hex},
        }

    async def publish(self, event: dict[str, Any], timeout_s: float = 2.0) -> tuple[bool, str]:
        try:
            await self.js.publish(
                event_subject(self.team, "doc.upserted", self.prefix),
                json.dumps(event).encode(),
                headers={"Nats-Msg-Id": event["event_id"]},
                timeout=timeout_s,
            )
            return True, ""
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"[:200]

    async def stop(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nc is not None:
            with contextlib.suppress(Exception):
                for name in (self.stream, f"{self.stream}_DLQ"):
                    await self.js.delete_stream(name)
                out["streams_deleted"] = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 30)
            except TimeoutError:
                self.proc.kill()
            out["consumer_rc"] = self.proc.returncode
        out["consumer_log_tail"] = self.log_tail(600).splitlines()[-5:]
        return out


async def wait_indexed(
    store: Any, workload: Workload, state: DocState, timeout_s: float
) -> float | None:
    """Seconds until ``state``'s document holds exactly its variant-0 chunks (None: never)."""
    want = sorted(workload.ledger.expected_ids(state, 0))
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            got = await asyncio.wait_for(
                asyncio.to_thread(store.get_chunks, workload.team, state.doc_type, state.doc_id),
                15,
            )
            if sorted(c.chunk_id for c in got) == want:
                return time.monotonic() - t0
        except Exception as exc:
            logger.debug("reading %s: %r", state.doc_id, exc)
        await asyncio.sleep(0.5)
    return None


# --- one fault ------------------------------------------------------------------------------


def bounds(settings: Any) -> dict[str, float]:
    """The longest each endpoint may take by the README's deadlines (+2 s for the 2-core
    client and proxy): a search sums its embed, graph and store deadlines (and rerank), the
    graph tools Neo4j's deadline, an ingest Serve's request timeout and a graph write."""
    s = settings.search
    query = s.embed_deadline_s + s.graph_deadline_s + s.store_deadline_s + 2.0
    if settings.reranker.enabled:
        query += s.rerank_deadline_s
    graph = settings.neo4j.deadline_s + 2.0
    return {"search": query, "enrich": query, "graph": graph, "path": graph, "ingest": 130.0}


def is_clear(sample: Sample, spec: FaultSpec) -> bool:
    pattern = re.compile(spec.names, re.IGNORECASE)
    if sample.status == 503 and pattern.search(sample.error):
        return True
    if sample.ok and any(pattern.search(r) for r in sample.degraded):
        return True
    return spec.name == "redis" and sample.ok and sample.cache.startswith("unavailable")


def is_normal(sample: Sample, spec: FaultSpec) -> bool:
    if not sample.normal:
        return False
    # With the cache on, a cached answer proves nothing about Milvus.
    return not (spec.name == "milvus" and sample.kind == "search" and sample.cache == "hit")


class FaultRunner:
    def __init__(
        self,
        args: argparse.Namespace,
        h: Any,
        gen: LoadGenerator,
        services: Services,
        store: Any,
        folder: Path,
    ) -> None:
        self.args = args
        self.h = h
        self.gen = gen
        self.rec: Recorder = gen.recorder
        self.workload: Workload = gen.workload
        self.services = services
        self.store = store
        self.folder = folder
        self.bounds = bounds(h.settings)
        self.bus: Bus | None = None
        self._refused_state: DocState | None = None

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.rec.t0, 2)

    # --- probes -----------------------------------------------------------------------
    async def probe_loop(self, spec: FaultSpec, stop: asyncio.Event) -> None:
        """A probe of ``spec``'s endpoint every ``--probe-s`` (at most 4 waiting)."""
        pending: set[asyncio.Task[Sample]] = set()
        fixed_query = self.workload.search_body(self.gen.rng)
        fixed_query.pop("graph", None)
        # The main probe every other time, the other affected kinds in turn between.
        others = [k for k in spec.affected if k != spec.probe]
        n = 0
        while not stop.is_set():
            pending = {t for t in pending if not t.done()}
            if len(pending) < 4:
                kind = others[(n // 2) % len(others)] if others and n % 2 else spec.probe
                n += 1
                if kind == "ingest":
                    state = self.workload.probe_doc(spec.name)
                    task = self.gen.spawn("ingest", probe=spec.name, state=(state, 0, "new"))
                elif spec.name == "redis":
                    task = self.gen.spawn("search", probe=spec.name, body=dict(fixed_query))
                else:
                    task = self.gen.spawn(kind, probe=spec.name)
                pending.add(task)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.args.probe_s)

    async def first(
        self, predicate: Any, since: float, timeout_s: float, *, sent_after: float | None = None
    ) -> Sample | None:
        """The first answer (by arrival) after ``since`` matching ``predicate``; waits up to
        ``timeout_s`` for one."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [
                s
                for s in self.rec.samples
                if s.done >= since and (sent_after is None or s.sent >= sent_after) and predicate(s)
            ]
            if found:
                return min(found, key=lambda s: s.done)
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.25)

    async def settle(self) -> dict[str, Any]:
        """Before a fault: one normal answer of every query kind, then ``--settle-s`` of
        load (bounded by ``--recover-timeout-s``)."""
        t0 = time.monotonic()
        missing = {k for k in ("search", "graph", "path", "enrich") if k in self.gen.mix}
        while missing and time.monotonic() - t0 < self.args.recover_timeout_s:
            for kind in sorted(missing):
                sample = await self.gen.request(kind, probe="settle")
                if sample.normal:
                    missing.discard(kind)
            if missing:
                await asyncio.sleep(1.0)
        await asyncio.sleep(self.args.settle_s)
        return {"s": round(time.monotonic() - t0, 1), "not_normal": sorted(missing)}

    async def readyz(self) -> dict[str, Any]:
        try:
            resp = await self.gen.client.get("/readyz", timeout=15)
            body = resp.json()
            return {"status": resp.status_code, "not_ready": body.get("not_ready")}
        except Exception as exc:
            return {"status": f"error: {exc!r}"}

    async def replicas(self) -> list[dict[str, Any]]:
        try:
            rows, _ = await asyncio.wait_for(asyncio.to_thread(serve_replicas), 30)
            return rows
        except Exception as exc:
            logger.warning("could not list the replicas: %r", exc)
            return []

    # --- the faults -----------------------------------------------------------------------
    async def run_fault(self, name: str) -> dict[str, Any]:
        spec = SPECS[name]
        logger.info("=== fault: %s ===", name)
        record: dict[str, Any] = {"fault": name, "settle": await self.settle()}
        replicas_before = await self.replicas()
        stop_probes = asyncio.Event()
        probes = asyncio.create_task(self.probe_loop(spec, stop_probes))
        extra: dict[str, Any] = {}
        try:
            if name == "embedder":
                t_fault, t_restore_start, t_restore = await self.kill_embedder(record)
            elif name == "nats":
                t_fault, t_restore_start, t_restore = await self.nats_outage(record, extra)
            else:
                t_fault, t_restore_start, t_restore = await self.service_outage(spec, record, extra)
            record["outage_s"] = round(t_restore - t_fault, 1)
            # The first normal answer after the dependency is back, per affected kind.
            normal: dict[str, Any] = {}
            budget = self.args.recover_timeout_s
            for kind in spec.affected:
                found = await self.first(
                    lambda s, kind=kind: s.kind == kind and is_normal(s, spec),
                    t_restore,
                    max(budget - (time.monotonic() - t_restore), 0.5),
                    sent_after=t_restore,
                )
                normal[kind] = (
                    {"after_restore_s": round(found.done - t_restore, 2), **found.brief(t_restore)}
                    if found
                    else None
                )
            record["first_normal"] = normal
            if spec.affected:
                times = [v["after_restore_s"] for v in normal.values() if v]
                record["time_to_first_normal_s"] = min(times) if times else None
                record["time_to_all_normal_s"] = max(times) if len(times) == len(normal) else None
            if name == "milvus":
                extra["refused_ingest"] = await self.retry_refused(extra.get("refused_ingest"))
            await asyncio.sleep(self.args.post_s)
        finally:
            stop_probes.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(probes, 10)
        t_end = time.monotonic()
        record.update(self.analyse(spec, t_fault, t_restore, t_end))
        record["readyz_after"] = await self.readyz()
        after = await self.replicas()
        before_ids = {r["actor_id"] for r in replicas_before}
        after_ids = {r["actor_id"] for r in after}
        record["replicas_replaced"] = sorted(
            r["deployment"] for r in replicas_before if r["actor_id"] not in after_ids
        )
        record["replicas_new"] = sorted(
            r["deployment"] for r in after if r["actor_id"] not in before_ids
        )
        if spec.affected:
            recovered = record.get("time_to_all_normal_s") is not None
        else:
            recovered = bool(extra.get("bus", {}).get("indexed_after_restore_s") is not None)
        record["recovered"] = recovered and record["readyz_after"].get("status") == 200
        # Nothing in this script redeploys: recovered here is recovered without a redeploy.
        record["recovered_without_redeploy"] = record["recovered"]
        record.update(extra)
        record["t_fault_s"] = self.rel(t_fault)
        record["t_restore_start_s"] = self.rel(t_restore_start)
        record["t_restored_s"] = self.rel(t_restore)
        logger.info(
            "%s: first clear answer after %s s, worst latency %s, 5xx-not-503 %d, first normal "
            "%s s after the restore, recovered %s",
            name,
            record.get("time_to_first_clear_s"),
            record.get("worst_latency_ms"),
            record["server_errors_during"],
            record.get("time_to_first_normal_s"),
            record["recovered"],
        )
        return record

    async def service_outage(
        self, spec: FaultSpec, record: dict[str, Any], extra: dict[str, Any]
    ) -> tuple[float, float, float]:
        t_fault = time.monotonic()
        record["stop"] = await self.services.run("down", spec.name, 90)
        if record["stop"]["rc"] != 0:
            logger.warning("stopping %s: %s", spec.name, record["stop"])
        # Wait (at most the outage) for the first clear answer before the refused ingest.
        await self.first(lambda s: is_clear(s, spec), t_fault, self.args.outage_s)
        if spec.name == "milvus":
            extra["refused_ingest"] = await self.refused_ingest()
        remaining = self.args.outage_s - (time.monotonic() - t_fault)
        if remaining > 0:
            await asyncio.sleep(remaining)
        t_restore_start = time.monotonic()
        record["restore"] = await self.services.run("up", spec.name, 300)
        t_restore = time.monotonic()
        if record["restore"]["rc"] != 0:
            logger.error("%s did not come back: %s", spec.name, record["restore"])
        return t_fault, t_restore_start, t_restore

    async def refused_ingest(self) -> dict[str, Any]:
        """An ingest of a new chapter while Milvus is down (expected: 503 naming Milvus)."""
        state = self.workload.ledger.take_new()
        if state is None:
            return {"skipped": "no new document left"}
        state.busy = True
        sample = await self.gen.request("ingest", probe="refused", state=(state, 0, "new"))
        out: dict[str, Any] = {
            "doc_id": state.doc_id,
            "expected_chunks": len(self.workload.ledger.expected_ids(state, 0)),
            "first": sample.brief(sample.sent),
        }
        logger.info("ingest during the Milvus outage: %s", out["first"])
        self._refused_state = state
        return out

    async def retry_refused(self, first: dict[str, Any] | None) -> dict[str, Any]:
        """The refused ingest again until acknowledged, then its chunks in Milvus: exactly
        its chunk ids, each once."""
        if not first or "doc_id" not in first:
            return first or {"skipped": "no refused ingest"}
        state = self._refused_state
        if state is None:
            return first
        t0 = time.monotonic()
        attempts = []
        acked: Sample | None = None
        while time.monotonic() - t0 < self.args.recover_timeout_s:
            state.busy = True
            sample = await self.gen.request("ingest", probe="retry", state=(state, 0, "new"))
            attempts.append(
                {"status": sample.status, "doc_status": sample.detail.get("doc_status")}
            )
            if sample.ok and sample.detail.get("doc_status") in ("indexed", "unchanged"):
                acked = sample
                break
            await asyncio.sleep(2.0)
        first = {**first, "retries": attempts}
        if acked is None:
            return {**first, "acknowledged": False}
        want = self.workload.ledger.expected_ids(state, 0)
        got = await asyncio.to_thread(
            self.store.get_chunks, self.workload.team, state.doc_type, state.doc_id
        )
        ids = [c.chunk_id for c in got]
        out = {
            **first,
            "acknowledged": True,
            "retry_doc_status": acked.detail.get("doc_status"),
            "retry_reported_chunks": acked.detail.get("chunks"),
            "stored_chunks": len(ids),
            "stored_distinct": len(set(ids)),
            "indexed_exactly_once": sorted(ids) == sorted(want) and len(ids) == len(set(ids)),
        }
        logger.info("refused ingest retried: %s", {k: v for k, v in out.items() if k != "first"})
        return out

    async def kill_embedder(self, record: dict[str, Any]) -> tuple[float, float, float]:
        import ray

        rows = [r for r in await self.replicas() if "Embedder" in r["deployment"]]
        if not rows:
            raise RuntimeError("no Embedder replica found")
        victim = rows[0]
        handle = await asyncio.to_thread(ray.get_actor, victim["name"], namespace="serve")
        t_fault = time.monotonic()
        await asyncio.to_thread(ray.kill, handle, no_restart=False)
        record["killed"] = {k: victim[k] for k in ("actor_id", "pid", "name")}
        logger.info("killed Embedder replica %s (pid %s)", victim["actor_id"], victim["pid"])
        # Serve's replacement: a new ALIVE Embedder replica actor (bounded).
        t_new: float | None = None
        while time.monotonic() - t_fault < self.args.recover_timeout_s:
            now_rows = [r for r in await self.replicas() if "Embedder" in r["deployment"]]
            if any(r["actor_id"] != victim["actor_id"] for r in now_rows):
                t_new = time.monotonic()
                break
            await asyncio.sleep(0.5)
        record["replacement_alive_after_s"] = round(t_new - t_fault, 2) if t_new else None
        # Keep the load on at least --outage-s after the kill, as for the services.
        remaining = self.args.outage_s - (time.monotonic() - t_fault)
        if remaining > 0:
            await asyncio.sleep(remaining)
        t_restore = t_new if t_new is not None else time.monotonic()
        return t_fault, t_fault, t_restore

    async def nats_outage(
        self, record: dict[str, Any], extra: dict[str, Any]
    ) -> tuple[float, float, float]:
        bus = self.bus
        if bus is None:
            bus = self.bus = Bus(
                self.services.url("nats"), self.h.settings, self.folder, self.workload.team
            )
            extra_start = await bus.start()
        else:
            extra_start = 0.0
        info: dict[str, Any] = {"consumer_start_s": round(extra_start, 1), "stream": bus.stream}
        ledger = self.workload.ledger
        # Before: one event published and indexed.
        before = self.workload.probe_doc("bus")
        ok, err = await bus.publish(bus.event(before.variant(0), uuid.uuid4().hex))
        ledger.settle(before, 0, "written" if ok else "uncertain")
        info["before"] = {"published": ok, "error": err}
        if ok:
            took = await wait_indexed(self.store, self.workload, before, 90)
            info["before"]["indexed_s"] = round(took, 2) if took is not None else None
        # The outage: publishing one event (one id) is tried every 2 s.
        t_fault = time.monotonic()
        record["stop"] = await self.services.run("down", "nats", 90)
        during = self.workload.probe_doc("bus-outage")
        during_event = bus.event(during.variant(0), uuid.uuid4().hex)
        tries: list[dict[str, Any]] = []
        first_error: float | None = None
        while time.monotonic() - t_fault < self.args.outage_s:
            t = time.monotonic()
            ok, err = await bus.publish(during_event)
            tries.append(
                {
                    "at_s": round(t - t_fault, 2),
                    "ok": ok,
                    "error": err,
                    "took_s": round(time.monotonic() - t, 2),
                }
            )
            if not ok and first_error is None:
                first_error = time.monotonic()
            await asyncio.sleep(2.0)
        ledger.settle(during, 0, "uncertain")
        info["publish_during_outage"] = tries[:20]
        record["time_to_first_clear_s_bus"] = (
            round(first_error - t_fault, 2) if first_error else None
        )
        t_restore_start = time.monotonic()
        record["restore"] = await self.services.run("up", "nats", 300)
        t_restore = time.monotonic()
        # After: a new event, published as soon as the publisher is back, must be indexed.
        after = self.workload.probe_doc("bus-after")
        after_event = bus.event(after.variant(0), uuid.uuid4().hex)
        published: float | None = None
        while time.monotonic() - t_restore < self.args.recover_timeout_s:
            ok, err = await bus.publish(after_event)
            if ok:
                published = time.monotonic()
                break
            await asyncio.sleep(1.0)
        info["published_after_restore_s"] = round(published - t_restore, 2) if published else None
        ledger.settle(after, 0, "written" if published else "uncertain")
        indexed = None
        if published is not None:
            left = max(self.args.recover_timeout_s - (time.monotonic() - t_restore), 5)
            took = await wait_indexed(self.store, self.workload, after, left)
            indexed = time.monotonic() - t_restore if took is not None else None
        info["indexed_after_restore_s"] = round(indexed, 2) if indexed is not None else None
        info["outage_event_indexed"] = (
            await wait_indexed(self.store, self.workload, during, 10) is not None
        )
        info["consumer_alive"] = bus.proc is not None and bus.proc.poll() is None
        record["time_to_first_normal_s"] = info["indexed_after_restore_s"]
        extra["bus"] = info
        logger.info("bus: %s", {k: v for k, v in info.items() if k != "publish_during_outage"})
        return t_fault, t_restore_start, t_restore

    # --- the numbers ------------------------------------------------------------------------
    def analyse(
        self, spec: FaultSpec, t_fault: float, t_restore: float, t_end: float
    ) -> dict[str, Any]:
        rec = self.rec
        during = [s for s in rec.samples if t_fault <= s.sent < t_restore]
        # Requests sent just before the fault and answered during it count for latency.
        overlapping = [s for s in rec.samples if s.sent < t_restore and s.done >= t_fault]
        clear = [s for s in rec.samples if s.done >= t_fault and is_clear(s, spec)]
        first_clear = min(clear, key=lambda s: s.done) if clear else None
        statuses: dict[str, Counter] = {}
        for s in during:
            statuses.setdefault(s.kind, Counter())[str(s.status)] += 1
        worst: dict[str, float] = {}
        for s in overlapping:
            worst[s.kind] = max(worst.get(s.kind, 0.0), s.latency_s)
        violations = [
            {**s.brief(t_fault), "bound_s": self.bounds.get(s.kind)}
            for s in overlapping
            if s.latency_s > self.bounds.get(s.kind, 130.0) or s.status == "timeout"
        ]
        server_errors = [
            s
            for s in overlapping
            if (isinstance(s.status, int) and s.status >= 500 and s.status != 503)
            or str(s.status).startswith("transport")
        ]
        after = [s for s in rec.samples if t_restore <= s.sent < t_end]
        abnormal_after = Counter(
            f"{s.kind}:{s.status}" + (":degraded" if s.degraded else "")
            for s in after
            if not s.normal
        )
        out: dict[str, Any] = {
            "time_to_first_clear_s": (
                round(first_clear.done - t_fault, 2) if first_clear else None
            ),
            "first_clear": first_clear.brief(t_fault) if first_clear else None,
            "statuses_during": {k: dict(sorted(v.items())) for k, v in statuses.items()},
            "degraded_during": dict(
                Counter(r.split(": ")[0][:100] for s in during for r in s.degraded).most_common(8)
            ),
            "cache_during": dict(Counter(s.cache.split(":")[0] for s in during if s.cache)),
            "worst_latency_ms": {k: round(v * 1000, 1) for k, v in sorted(worst.items())},
            "bound_s": self.bounds,
            "within_bounds": not violations,
            "bound_violations": violations[:10],
            "server_errors_during": len(server_errors),
            # Anything but 200 and 503 (a 4xx for a request that was valid before the fault).
            "unexpected_answers": [
                s.brief(t_fault) for s in overlapping if s.status not in (200, 503)
            ][:10],
            "server_error_samples": [s.brief(t_fault) for s in server_errors[:10]],
            "not_normal_after_restore": dict(abnormal_after),
            "not_normal_after_restore_samples": [s.brief(t_restore) for s in after if not s.normal][
                :8
            ],
            "requests_during": len(during),
        }
        if spec.name == "nats":
            out["time_to_first_clear_s"] = None
            out["first_clear"] = "n/a: the gateway does not use NATS (see bus)"
        return out


# --- the run ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.fault_run",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_load_arguments(p)
    p.set_defaults(port=8310, collection="bench_faults", team="bench_faults_t0")
    p.add_argument("--faults", default=",".join(ALL_FAULTS), help="in this order")
    p.add_argument("--rate", type=float, default=3.0, help="steady load, requests per second")
    p.add_argument("--outage-s", type=float, default=25.0, help="how long each fault is held")
    p.add_argument("--recover-timeout-s", type=float, default=120.0)
    p.add_argument("--settle-s", type=float, default=8.0, help="normal load before each fault")
    p.add_argument("--post-s", type=float, default=8.0, help="load watched after the recovery")
    p.add_argument("--probe-s", type=float, default=1.0)
    p.add_argument(
        "--cache",
        choices=("auto", "off", "memory", "redis"),
        default="auto",
        help="auto: redis when redis is a fault, else off",
    )
    p.add_argument(
        "--private-services",
        action="store_true",
        help="own Milvus/Neo4j/NATS/Redis in a temp RAG_VAR_DIR on ports "
        + ", ".join(f"{k} {v}" for k, v in PRIVATE_PORTS.items()),
    )
    return p


async def run(
    args: argparse.Namespace, h: Any, services: Services, folder: Path, faults: list[str]
) -> dict[str, Any]:
    store = h.milvus_store()
    store.start()
    headers = {"authorization": f"Bearer {token(args.team, h.settings)}"}
    limits = httpx.Limits(max_connections=args.max_in_flight + 16, max_keepalive_connections=64)
    result: dict[str, Any] = {"faults": []}
    runner: FaultRunner | None = None
    try:
        async with httpx.AsyncClient(base_url=h.base_url, headers=headers, limits=limits) as client:
            workload, seeded, count_before = await prepare(
                args, client, h.settings, store, args.seed_mode or "store"
            )
            result["seed_data"] = seeded
            gen = LoadGenerator(
                client,
                workload,
                Recorder(),
                rate=args.rate,
                mix=args.mix,
                seed=args.seed,
                late_s=args.late_ms / 1000,
                max_in_flight=args.max_in_flight,
            )
            result["warmup"] = await warm_up(client, gen, args.warmup)
            gen.recorder = Recorder()
            runner = FaultRunner(args, h, gen, services, store, folder)
            stop = asyncio.Event()
            load = asyncio.create_task(gen.run(10 * 86_400, stop=stop, progress_s=args.progress_s))
            try:
                for name in faults:
                    try:
                        result["faults"].append(await runner.run_fault(name))
                    except Exception as exc:
                        logger.exception("fault %s failed to run", name)
                        result["faults"].append({"fault": name, "failed_to_run": repr(exc)})
                    finally:
                        # Whatever happened, the next fault starts with every service up.
                        for svc in sorted(services.down_now):
                            logger.warning("starting %s again", svc)
                            await services.run("up", svc, 300)
            finally:
                stop.set()
                ran = await load
            rec = gen.recorder
            result["load"] = {
                "rate": args.rate,
                "ran_s": round(ran, 1),
                "endpoints": summarize(
                    [s for s in rec.samples if not s.probe],
                    ran,
                    rec.scheduled,
                    rec.late,
                    rec.dropped,
                ),
                "probes": summarize([s for s in rec.samples if s.probe], ran),
            }
            if runner.bus is not None:
                result["bus_cleanup"] = await runner.bus.stop()
                runner.bus = None
            result["readyz_end"] = await runner.readyz()
        if count_before is not None:
            result["chunks"] = await asyncio.to_thread(
                verify_chunks, store, args.team, workload.ledger, count_before
            )
    finally:
        if runner is not None and runner.bus is not None:
            with contextlib.suppress(Exception):
                await runner.bus.stop()
        services.restore_all()
        if args.cache == "redis":
            with contextlib.suppress(Exception):
                from serve_app.search.cache.store import RedisCacheStore

                cfg = h.settings.cache
                cache = RedisCacheStore(cfg.redis_url, cfg.redis_prefix, 256, 5.0)
                result["redis_keys_deleted"] = await cache.clear()
                await cache.close()
        store.close()
    return result


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def render(result: dict[str, Any]) -> str:
    rows = []
    for f in result.get("faults", []):
        if "skipped" in f:
            rows.append([f["fault"], "skipped: " + f["skipped"]] + ["–"] * 6)
            continue
        if "failed_to_run" in f:
            rows.append([f["fault"], "failed to run: " + f["failed_to_run"][:80]] + ["–"] * 6)
            continue
        clear = f.get("first_clear")
        if isinstance(clear, dict):
            what = f"{clear['kind']} {clear['status']}"
            text = clear["error"] or "; ".join(clear["degraded"]) or clear["cache"]
            what += f" ({text[:60]})"
        else:
            what = str(clear or "none")
        if f["fault"] == "nats":
            bus = f.get("bus", {})
            what = (
                f"publish fails after {fmt(f.get('time_to_first_clear_s_bus'))} s "
                f"(gateway unaffected)"
            )
            normal = f"{fmt(bus.get('indexed_after_restore_s'))} (event indexed)"
        else:
            normal = fmt(f.get("time_to_first_normal_s"))
            if f.get("time_to_all_normal_s") != f.get("time_to_first_normal_s"):
                normal += f" / all {fmt(f.get('time_to_all_normal_s'))}"
        worst = ", ".join(f"{k} {v:.0f}" for k, v in f.get("worst_latency_ms", {}).items())
        statuses = "; ".join(
            f"{k}: " + " ".join(f"{s}×{n}" for s, n in v.items())
            for k, v in f.get("statuses_during", {}).items()
        )
        rows.append(
            [
                f["fault"],
                fmt(f.get("time_to_first_clear_s")),
                what,
                worst + ("" if f.get("within_bounds") else " **over bound**"),
                statuses,
                f.get("server_errors_during"),
                normal,
                "yes" if f.get("recovered_without_redeploy") else "**no**",
            ]
        )
    parts = [
        markdown_table(
            [
                "fault",
                "first clear answer s",
                "clear answer",
                "worst latency ms (outage)",
                "statuses during outage",
                "500s",
                "first normal after restore s",
                "recovered w/o redeploy",
            ],
            rows,
        )
    ]
    for f in result.get("faults", []):
        ri = f.get("refused_ingest")
        if ri and "first" in ri:
            parts.append(
                f"Milvus outage ingest of {ri['doc_id']}: {ri['first']['status']} "
                f"({ri['first']['error'][:80]}); retried: {ri.get('retries')}; stored "
                f"{ri.get('stored_chunks')} chunks of {ri.get('expected_chunks')} expected, "
                f"exactly once: {ri.get('indexed_exactly_once')}"
            )
        if f.get("replicas_replaced"):
            parts.append(f"{f['fault']}: Serve replaced {f['replicas_replaced']}")
    ch = result.get("chunks")
    if ch:
        parts.append(
            f"Chunks of {ch['team']}: {ch['count_after']} stored, "
            f"{ch['expected_from_acknowledged']} expected ({'exact' if ch['exact'] else 'MISMATCH'}"
            f", {ch['mismatched_documents']} documents mismatched, uncertain "
            f"{ch['uncertain_documents'] or 0})"
        )
    load = result.get("load", {}).get("endpoints", {}).get("all")
    if load:
        parts.append(
            f"Load: {load['answered']} answers, statuses {load['statuses']}, p50 "
            f"{load['latency'].get('p50_ms')} ms, max {load['latency'].get('max_ms')} ms, "
            f"missed schedule {load['missed_schedule']['total']}"
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if isinstance(args.mix, str):
        args.mix = parse_mix(args.mix)
    if isinstance(args.ingest_shares, str):
        args.ingest_shares = parse_shares(args.ingest_shares)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in faults if f not in SPECS]
    if unknown:
        raise SystemExit(f"unknown faults {unknown}; choose from {ALL_FAULTS}")
    if args.cache == "auto":
        args.cache = "redis" if "redis" in faults else "off"
    skipped = []
    if "redis" in faults and args.cache != "redis":
        faults.remove("redis")
        skipped.append({"fault": "redis", "skipped": "the cache is not in Redis in this run"})
    services = Services(args.private_services)
    folder = Path(tempfile.mkdtemp(prefix="bench_faults_", dir="/tmp"))
    result: dict[str, Any] = {
        "benchmark": "faults",
        "args": vars(args),
        "environment": environment_info(),
        "services": {"private": services.private, "ports": services.ports},
    }
    from bench.common import write_result
    from bench.serve_harness import ServeHarness, run_benchmark

    try:
        if services.private:
            need = ["milvus", "neo4j"] + [n for n in ("nats", "redis") if n in faults]
            services.start_private(need)
        args.redis_url = services.url("redis")
        settings = harness_settings(args, folder)
        settings["milvus"] = {"uri": services.url("milvus")}
        settings["neo4j"] = {"uri": services.url("neo4j")}
        if args.cache == "redis":
            settings["cache"]["redis_prefix"] = f"bench_faults:{secrets.token_hex(4)}:"
        harness = ServeHarness(
            port=args.port,
            collection=args.collection,
            tenant_prefix=args.team,
            settings=settings,
        )
        result["deadlines"] = deadlines(harness.settings)
        result["bounds_s"] = bounds(harness.settings)
        result["cache"] = (
            harness.settings.cache.backend if harness.settings.cache.enabled else "off"
        )

        def render_all(res: dict[str, Any]) -> str:
            res["faults"] = res.get("faults", []) + skipped
            return render(res)

        try:
            run_benchmark(
                "faults",
                harness,
                result,
                lambda h: run(args, h, services, folder, faults),
                render_all,
                args.out,
            )
        except BaseException:
            result.setdefault("table_markdown", "(the run failed; see the log)")
            write_result("faults", result, args.out)
            raise
        finally:
            services.restore_all()
    finally:
        services.stop_private()
        shutil.rmtree(folder, ignore_errors=True)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
