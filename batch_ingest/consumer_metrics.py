"""The bus consumer's Prometheus metrics (issue 34): what it applied, how far behind the stream
it is and how many letters wait in the dead-letter stream. The consumer runs outside Ray
Serve, so it serves its own ``/metrics`` (``nats.metrics_port``, ``--metrics-port``; 0: off).

- ``rag_bus_events_total{status}``: events by result (indexed, unchanged, skipped_stale,
  deleted, failed, invalid);
- ``rag_bus_batch_seconds``: time to apply and settle one batch;
- ``rag_bus_consumer_pending``: events in the stream not yet delivered to the consumer (its
  lag), ``rag_bus_consumer_ack_pending``: delivered, not yet acknowledged (in work or waiting
  out an outage);
- ``rag_bus_dead_letters``: letters in the dead-letter stream (``python -m batch_ingest.dlq``).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger("batch_ingest.consumer")

SECONDS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]


class ConsumerMetrics:
    """The metrics of one consumer process, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "rag_bus_events", "Bus events applied, by result", ["status"], registry=r
        )
        self.batch_seconds = Histogram(
            "rag_bus_batch_seconds",
            "Seconds to apply and settle a batch",
            buckets=SECONDS,
            registry=r,
        )
        self.pending = Gauge(
            "rag_bus_consumer_pending", "Events in the stream not yet delivered", registry=r
        )
        self.ack_pending = Gauge(
            "rag_bus_consumer_ack_pending", "Events delivered, not yet acknowledged", registry=r
        )
        self.dead_letters = Gauge(
            "rag_bus_dead_letters", "Letters in the dead-letter stream", registry=r
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
        logger.info("metrics on http://%s:%d/metrics", host, port)

    def batch(self, statuses: list[str], seconds: float) -> None:
        for status in statuses:
            self.events.labels(status=status).inc()
        self.batch_seconds.observe(seconds)

    async def refresh(self, js: Any, stream: str, durable: str, dlq_stream: str) -> None:
        """The lag and the dead letters, read from the server (never raises)."""
        try:
            info = await js.consumer_info(stream, durable)
            self.pending.set(info.num_pending or 0)
            self.ack_pending.set(info.num_ack_pending or 0)
            self.dead_letters.set((await js.stream_info(dlq_stream)).state.messages or 0)
        except Exception as exc:  # noqa: BLE001 (a scrape shows the last values)
            logger.debug("consumer metrics not refreshed: %s", exc)
