"""The faults themselves (``FaultScenarios``): stopping a service for ``--outage-s`` and
starting it again (with, for Milvus, an ingest refused during the outage and retried after
it), killing the Embedder replica, and the NATS outage seen by the bus's publisher and
consumer. Each returns the times of the fault, of the restore's start and of its end; the
probes they wait on are the runner's (``bench.fault_probes``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_load import DocState, Sample
from bench.fault_bus import Bus, wait_indexed
from bench.fault_probes import FaultProbes
from bench.fault_services import Services
from bench.fault_specs import FaultSpec, is_clear

logger = logging.getLogger("bench.faults")


class FaultScenarios:
    """One method per fault; ``bus`` is the nats fault's, kept for the run to stop."""

    def __init__(
        self, probes: FaultProbes, h: Any, services: Services, store: Any, folder: Path
    ) -> None:
        self.probes = probes
        self.args = probes.args
        self.gen = probes.gen
        self.workload = probes.workload
        self.h = h
        self.services = services
        self.store = store
        self.folder = folder
        self.bus: Bus | None = None
        self._refused_state: DocState | None = None

    async def service_outage(
        self, spec: FaultSpec, record: dict[str, Any], extra: dict[str, Any]
    ) -> tuple[float, float, float]:
        t_fault = time.monotonic()
        record["stop"] = await self.services.run("down", spec.name, 90)
        if record["stop"]["rc"] != 0:
            logger.warning("stopping %s: %s", spec.name, record["stop"])
        # Wait (at most the outage) for the first clear answer before the refused ingest.
        await self.probes.first(lambda s: is_clear(s, spec), t_fault, self.args.outage_s)
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

        rows = [r for r in await self.probes.replicas() if "Embedder" in r["deployment"]]
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
            now_rows = [r for r in await self.probes.replicas() if "Embedder" in r["deployment"]]
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
