"""EventConsumer.run on a fake pull subscription: stopping and cancellation."""

from __future__ import annotations

import asyncio

import pytest

from batch_ingest.consumer import ConsumerSettings, EventConsumer


class FakeNc:
    def jetstream(self) -> object:
        return object()


class SwallowingSub:
    """A fetch that loses its cancellation the way ``asyncio.wait_for`` of Python 3.11 does
    when the message arrives at the same moment: it returns the message instead."""

    def __init__(self) -> None:
        self.fetches = 0
        self.waiting = asyncio.Event()

    async def fetch(self, batch: int, timeout: float) -> list[str]:
        self.fetches += 1
        if self.fetches > 1:
            await asyncio.sleep(0.01)
            return []
        self.waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return ["message"]
        return []


class Handled(EventConsumer):
    def __init__(self, sub: SwallowingSub) -> None:
        super().__init__(FakeNc(), pipeline=None, cfg=ConsumerSettings(batch=1))  # type: ignore[arg-type]
        self._sub = sub
        self.handled: list[list[str]] = []

    async def handle(self, msgs):  # type: ignore[override]
        self.handled.append(msgs)
        return []


async def test_a_cancellation_lost_inside_fetch_still_stops_the_consumer():
    sub = SwallowingSub()
    consumer = Handled(sub)
    task = asyncio.create_task(consumer.run(asyncio.Event()))
    await asyncio.wait_for(sub.waiting.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert consumer.handled == []  # the message fetched as it was cancelled is not handled
    assert sub.fetches == 1


async def test_stop_ends_the_loop_after_the_current_fetch():
    sub = SwallowingSub()
    sub.fetches = 1  # every fetch returns nothing at once
    consumer = Handled(sub)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert consumer.handled == []
