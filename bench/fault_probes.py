"""The load's side of a fault (``FaultProbes``): a probe of the faulted dependency's
endpoint every ``--probe-s`` besides the steady load, the first answer matching a predicate
(bounded), the settling before a fault, ``/readyz`` and the Serve replicas. The scenarios
(``bench.fault_scenarios``) and the runner (``bench.fault_run.FaultRunner``) use them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from typing import Any

from bench.bench_load import LoadGenerator, Recorder, Sample, Workload, serve_replicas
from bench.fault_specs import FaultSpec

logger = logging.getLogger("bench.faults")


class FaultProbes:
    """Probes and waits on ``gen``'s traffic, as recorded by ``rec`` (``gen.recorder`` when
    they are made)."""

    def __init__(self, args: argparse.Namespace, gen: LoadGenerator) -> None:
        self.args = args
        self.gen = gen
        self.rec: Recorder = gen.recorder
        self.workload: Workload = gen.workload

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
