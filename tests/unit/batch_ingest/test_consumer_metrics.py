"""The bus consumer's own Prometheus metrics (batch_ingest/consumer_metrics.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from batch_ingest.consumer_metrics import ConsumerMetrics
from batch_ingest.event_types import event_subject
from tests.unit.batch_ingest.events.test_events import upsert
from tests.unit.batch_ingest.test_bus_subjects import TEAM, make_consumer
from tests.unit.test_tracing import FakeMsg


class FakeJs:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def consumer_info(self, stream, durable):
        if self.fail:
            raise ConnectionError("nats down")
        return SimpleNamespace(num_pending=7, num_ack_pending=2)

    async def stream_info(self, stream):
        return SimpleNamespace(state=SimpleNamespace(messages=3))


def value(m: ConsumerMetrics, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_each_batch_counts_its_events_by_result(tmp_path):
    consumer = make_consumer(tmp_path)
    consumer.metrics = ConsumerMetrics()
    good = FakeMsg(upsert("d1", "notes", revision=1), event_subject(TEAM, "doc.upserted"))
    forged = FakeMsg(upsert("d2", "notes", revision=1), event_subject("team_b", "doc.upserted"))
    asyncio.run(consumer.handle([good, forged]))
    m = consumer.metrics
    assert value(m, "rag_bus_events_total", status="indexed") == 1
    assert value(m, "rag_bus_events_total", status="invalid") == 1
    assert value(m, "rag_bus_batch_seconds_count") == 1


def test_lag_and_dead_letters_come_from_the_server_and_a_failure_keeps_the_last():
    m = ConsumerMetrics()
    asyncio.run(m.refresh(FakeJs(), "S", "d", "S_DLQ"))
    assert value(m, "rag_bus_consumer_pending") == 7
    assert value(m, "rag_bus_consumer_ack_pending") == 2
    assert value(m, "rag_bus_dead_letters") == 3
    asyncio.run(m.refresh(FakeJs(fail=True), "S", "d", "S_DLQ"))  # never raises
    assert value(m, "rag_bus_consumer_pending") == 7
