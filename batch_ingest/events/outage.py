"""Holding a batch through a backend outage instead of sending it round the stream.

A batch that failed only because a backend is down (every event ``failed`` and retryable:
Milvus, Neo4j or the audit database not answering) is kept by the consumer, marked in
progress so JetStream does not redeliver it, while the backends are probed every
``probe_s``; nothing else is fetched meanwhile. The moment every backend answers again the
batch is applied, so a backlog is indexed within seconds of the recovery instead of after
the redelivery delays its naks had accumulated (up to ``nats.retry_max_delay_s`` each,
issue 34). When the probes say all is well but the batch still fails (a cause they do not
see), it waits 1, 2, 4 … s (at most ``retry_max_delay_s``) between attempts. A batch older
than ``nats.retry_for_s``, or a consumer asked to stop, is settled the usual way (nak, or
the dead-letter stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from batch_ingest.events.results import EventResult

logger = logging.getLogger("batch_ingest.consumer")


def is_outage(results: list[EventResult]) -> bool:
    """Whether a batch failed as a whole for a passing cause (nothing of it applied)."""
    valid = [r for r in results if r.status != "invalid"]
    # A document already written (searchable, its graph write failed) is announced and
    # retried by redelivery as before; only a batch of which nothing was applied is held.
    return bool(valid) and all(
        r.status == "failed" and r.retryable and not r.searchable for r in valid
    )


def backend_probes(consumer: Any) -> list[Callable[[], Awaitable[bool]]]:
    """Whether each backend of a consumer's writes answers: its pipeline's store and graph
    (looked up at each call, so a replaced store is probed as it is) and its audit log."""

    async def backends() -> bool:
        for backend in (consumer.pipeline.store, consumer.pipeline.graph):
            status = getattr(backend, "status", None)
            if status is not None and not (await status()).get("ready"):
                return False
        return True

    async def audit_log() -> bool:
        if consumer.audit is not None:
            await asyncio.to_thread(consumer.audit.store.ping)
        return True

    return [backends, audit_log]


class OutageGate:
    """Waits out an outage for the consumer (see the module docstring).

    Args:
        probes: the health checks (each returns whether its backend answers).
        keep_alive: marks the held messages in progress while it runs.
        age_s: the age of the oldest held message.
    """

    def __init__(
        self,
        probes: list[Callable[[], Awaitable[bool]]],
        keep_alive: Callable[[list[Any]], Coroutine[Any, Any, None]],
        age_s: Callable[[Any], float],
        *,
        retry_for_s: float,
        max_delay_s: float,
        probe_s: float = 1.0,
    ) -> None:
        self.probes = probes
        self.keep_alive = keep_alive
        self.age_s = age_s
        self.retry_for_s = retry_for_s
        self.max_delay_s = max_delay_s
        self.probe_s = probe_s

    async def ready(self) -> bool:
        answers = await asyncio.gather(*(p() for p in self.probes), return_exceptions=True)
        return all(a is True for a in answers)

    async def hold(self, msgs: list[Any], rounds: int, stop: asyncio.Event) -> bool:
        """Hold ``msgs`` until the backends answer again: True to apply them now, False to
        settle them as they are (too old, or stopping)."""
        least = min(2.0**rounds, self.max_delay_s)
        started = time.monotonic()
        saw_down = False
        beat = asyncio.create_task(self.keep_alive(msgs))
        try:
            while not stop.is_set():
                if max(self.age_s(m) for m in msgs) >= self.retry_for_s:
                    return False
                ready = await self.ready()
                waited = time.monotonic() - started
                if ready and (saw_down or waited >= least):
                    if saw_down:
                        logger.info("backends answer again after %.1f s; applying %d held events",
                                    waited, len(msgs))  # fmt: skip
                    return True
                if not ready and not saw_down:
                    saw_down = True
                    logger.warning("a backend is down: holding %d events, probing every %g s",
                                   len(msgs), self.probe_s)  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.probe_s)
            return False
        finally:
            beat.cancel()
