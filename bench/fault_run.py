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

This module is the command and ``FaultRunner``; the faults' definitions are in
``bench.fault_specs``, the services in ``bench.fault_services``, the bus in ``bench.fault_bus``,
the probes in ``bench.fault_probes``, the faults themselves in ``bench.fault_scenarios`` and
the numbers and the table in ``bench.fault_report``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.bench_load import (
    LoadGenerator,
    Recorder,
    add_load_arguments,
    deadlines,
    harness_settings,
    parse_mix,
    parse_shares,
    prepare,
    summarize,
    token,
    verify_chunks,
    warm_up,
)
from bench.common import environment_info, setup_logging
from bench.fault_bus import Bus
from bench.fault_probes import FaultProbes
from bench.fault_report import analyse, render
from bench.fault_scenarios import FaultScenarios
from bench.fault_services import PRIVATE_PORTS, Services
from bench.fault_specs import ALL_FAULTS, SPECS, bounds, is_normal

# Bus and Services were defined here; bench/bus_outage.py imports them from this module.
__all__ = ["Bus", "FaultRunner", "Services", "build_parser", "main", "run"]

logger = logging.getLogger("bench.faults")


class FaultRunner(FaultProbes):
    """One fault at a time (``run_fault``): its scenario (``bench.fault_scenarios``) under
    the probes, the first normal answers after the restore, the numbers
    (``bench.fault_report.analyse``) and the replicas Serve replaced meanwhile."""

    def __init__(
        self,
        args: argparse.Namespace,
        h: Any,
        gen: LoadGenerator,
        services: Services,
        store: Any,
        folder: Path,
    ) -> None:
        super().__init__(args, gen)
        self.bounds = bounds(h.settings)
        self.scenarios = FaultScenarios(self, h, services, store, folder)

    async def run_fault(self, name: str) -> dict[str, Any]:
        spec = SPECS[name]
        logger.info("=== fault: %s ===", name)
        record: dict[str, Any] = {"fault": name, "settle": await self.settle()}
        replicas_before = await self.replicas()
        stop_probes = asyncio.Event()
        probes = asyncio.create_task(self.probe_loop(spec, stop_probes))
        extra: dict[str, Any] = {}
        scenarios = self.scenarios
        try:
            if name == "embedder":
                t_fault, t_restore_start, t_restore = await scenarios.kill_embedder(record)
            elif name == "nats":
                t_fault, t_restore_start, t_restore = await scenarios.nats_outage(record, extra)
            else:
                t_fault, t_restore_start, t_restore = await scenarios.service_outage(
                    spec, record, extra
                )
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
                extra["refused_ingest"] = await scenarios.retry_refused(extra.get("refused_ingest"))
            await asyncio.sleep(self.args.post_s)
        finally:
            stop_probes.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(probes, 10)
        t_end = time.monotonic()
        record.update(analyse(self.rec, self.bounds, spec, t_fault, t_restore, t_end))
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
            if runner.scenarios.bus is not None:
                result["bus_cleanup"] = await runner.scenarios.bus.stop()
                runner.scenarios.bus = None
            result["readyz_end"] = await runner.readyz()
        if count_before is not None:
            result["chunks"] = await asyncio.to_thread(
                verify_chunks, store, args.team, workload.ledger, count_before
            )
    finally:
        if runner is not None and runner.scenarios.bus is not None:
            with contextlib.suppress(Exception):
                await runner.scenarios.bus.stop()
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
