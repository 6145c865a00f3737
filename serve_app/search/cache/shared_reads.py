"""Reads of a value other processes change (a team's index generation), shared by the
searches that need it at the same time, without ever answering one with a value read before
it arrived.

A caller that finds no read of its key in flight starts one. A caller that finds one in
flight cannot use it (it began before the caller arrived, so it may miss a write the caller
saw acknowledged): it waits for the *next* read, which starts as soon as the one in flight
ends and serves every caller that arrived meanwhile. So under load one read per key is in
flight and one queued, whatever the number of concurrent searches; alone, a search reads
once, as before.

With ``read_now`` (a read that answers at once or not at all: the SQLite state database's
file, read directly) a caller first tries that on the event loop: a few microseconds
against a worker thread's hand-off (~0.3 ms a search). Only when it cannot answer (another
backend, a writer's lock) does the caller take the shared, threaded path above."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SharedReads(Generic[K, V]):
    """``await get(key)``: ``read(key)`` (blocking; run in a worker thread) as of some time
    after the call began, shared with concurrent calls of the same key."""

    def __init__(
        self, read: Callable[[K], V], read_now: Callable[[K], V | None] | None = None
    ) -> None:
        self._read = read
        self._read_now = read_now
        self._running: dict[K, asyncio.Future[V]] = {}
        self._next: dict[K, asyncio.Future[V]] = {}
        self.reads = 0
        self.shared = 0
        self.direct = 0  # of the reads, those ``read_now`` answered

    async def get(self, key: K) -> V:
        if self._read_now is not None:
            value = self._read_now(key)  # begins now: after the caller arrived
            if value is not None:
                self.reads += 1
                self.direct += 1
                return value
        running = self._running.get(key)
        if running is None:
            return await asyncio.shield(self._start(key))
        queued = self._next.get(key)
        if queued is None:
            queued = self._next[key] = asyncio.get_running_loop().create_future()
            # Retrieved even when every caller waiting on it was cancelled meanwhile.
            queued.add_done_callback(lambda f: f.cancelled() or f.exception())
            running.add_done_callback(lambda _: self._promote(key))
        else:
            self.shared += 1
        return await asyncio.shield(queued)

    def _start(self, key: K, into: asyncio.Future[V] | None = None) -> asyncio.Future[V]:
        self.reads += 1
        task = asyncio.ensure_future(asyncio.to_thread(self._read, key))
        self._running[key] = task
        task.add_done_callback(lambda t: self._finish(key, t, into))
        return task

    def _finish(self, key: K, task: asyncio.Future[V], into: asyncio.Future[V] | None) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        error = None if task.cancelled() else task.exception()  # retrieved either way
        if into is None or into.done():
            return
        if task.cancelled():
            into.cancel()
        elif error is not None:
            into.set_exception(error)
        else:
            into.set_result(task.result())

    def _promote(self, key: K) -> None:
        """The read in flight ended: the queued callers' read starts now."""
        queued = self._next.pop(key, None)
        if queued is not None:
            self._start(key, into=queued)
