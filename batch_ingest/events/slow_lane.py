"""The slow lane of the bus consumer: events over ``nats.large_event_bytes`` (a long document
takes a minute to embed on a CPU) are applied one at a time beside the fetch loop, so small
events fetched with or after them are indexed at once instead of waiting behind them. Events
waiting in the lane are kept alive (``in_progress``) so the server does not redeliver them;
the ones still waiting at a stop are left unacknowledged and come back after the ack wait."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("batch_ingest.consumer")


class SlowLane:
    def __init__(
        self, handle: Callable[[list[Any]], Awaitable[Any]], period_s: float, depth: int = 4
    ) -> None:
        self.handle = handle
        self.period_s = period_s
        self.queue: asyncio.Queue[Any] = asyncio.Queue(depth)
        self.waiting: list[Any] = []
        self.busy = asyncio.Event()  # set while an event is being applied
        self.closing = False
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._beat())]

    async def put(self, msg: Any) -> None:
        """Queue ``msg`` (waits while ``depth`` events are queued: the fetch loop slows)."""
        self.start()
        self.waiting.append(msg)
        await self.queue.put(msg)

    async def _run(self) -> None:
        while True:
            msg = await self.queue.get()
            if self.closing:  # left unacknowledged: redelivered after the ack wait
                self.waiting.remove(msg)
                continue
            self.busy.set()
            try:
                await self.handle([msg])
            except Exception as exc:  # noqa: BLE001 (unacked: redelivered after the ack wait)
                logger.warning("large event not applied: %s: %s", type(exc).__name__, exc)
            finally:
                self.waiting.remove(msg)
                self.busy.clear()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            for msg in list(self.waiting):
                with contextlib.suppress(Exception):
                    await msg.in_progress()

    async def close(self) -> None:
        """Finish the event being applied; leave the queued ones to redelivery."""
        if not self._tasks:
            return
        run, beat = self._tasks
        self.closing = True
        beat.cancel()
        while self.busy.is_set() and not run.done():
            await asyncio.sleep(0.05)
        run.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.closing = False
