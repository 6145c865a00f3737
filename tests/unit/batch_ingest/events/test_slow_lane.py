"""Issue 34: a small event fetched with a large document is indexed at once, not after it."""

from __future__ import annotations

import asyncio
import time

import nats.errors

from batch_ingest.event_types import event_subject
from tests.unit.batch_ingest.events.test_events import upsert
from tests.unit.batch_ingest.test_bus_subjects import TEAM, make_consumer
from tests.unit.test_tracing import FakeMsg


class CountingMsg(FakeMsg):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.kept_alive = 0

    async def in_progress(self) -> None:
        self.kept_alive += 1


class FakeSub:
    def __init__(self, batches) -> None:
        self.batches = batches

    async def fetch(self, n, timeout):
        if self.batches:
            return self.batches.pop(0)
        await asyncio.sleep(min(timeout, 0.05))
        raise nats.errors.TimeoutError


def test_a_small_event_does_not_wait_behind_a_large_one(tmp_path):
    consumer = make_consumer(tmp_path, large_event_bytes=2_000, backoff_s=(0.2,))
    big_text = " ".join(f"word{i}" for i in range(600))  # > 2,000 bytes
    large = CountingMsg(upsert("big", big_text, revision=1), event_subject(TEAM, "doc.upserted"))
    small = CountingMsg(
        upsert("small", "short note", revision=1), event_subject(TEAM, "doc.upserted")
    )
    consumer._sub = FakeSub([[large, small]])
    done: dict[str, float] = {}
    real_handle = consumer.handle

    async def slow_handle(msgs):  # the large document embeds for a while
        await asyncio.sleep(1.0)
        out = await real_handle(msgs)
        done["big"] = time.perf_counter()
        return out

    consumer.slow.handle = slow_handle

    async def main() -> float:
        started = time.perf_counter()
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop))
        while "small" not in done:
            if small.settled:
                done["small"] = time.perf_counter()
            await asyncio.sleep(0.01)
        while not large.settled:
            await asyncio.sleep(0.05)
        stop.set()
        await task
        return started

    started = asyncio.run(main())
    assert small.settled == ["ack"] and large.settled == ["ack"]
    assert done["small"] - started < 0.5 < done["big"] - started
    assert large.kept_alive >= 1  # no redelivery while it waited and ran
    indexed = {
        d
        for d in ("big", "small")
        if any(c.doc_id == d for c in consumer.pipeline.store.rows.values())
    }
    assert indexed == {"big", "small"}


def test_a_stop_finishes_the_large_event_being_applied(tmp_path):
    consumer = make_consumer(tmp_path, large_event_bytes=100, backoff_s=(0.2,))
    text = " ".join(f"w{i}" for i in range(100))
    first = CountingMsg(upsert("a", text, revision=1), event_subject(TEAM, "doc.upserted"))
    second = CountingMsg(upsert("b", text, revision=1), event_subject(TEAM, "doc.upserted"))
    consumer._sub = FakeSub([[first, second]])
    real_handle = consumer.handle

    async def slow_handle(msgs):
        await asyncio.sleep(0.5)
        return await real_handle(msgs)

    consumer.slow.handle = slow_handle

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop))
        while not consumer.slow.busy.is_set():
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(main())
    assert first.settled == ["ack"]  # finished
    assert second.settled == []  # left to redelivery
