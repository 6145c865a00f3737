"""SharedReads (serve_app/search/cache/shared_reads.py): concurrent reads of a team's generation
share one read, and a caller never gets a value read before it arrived."""

from __future__ import annotations

import asyncio
import threading

import pytest

from serve_app.search.cache.shared_reads import SharedReads


class Store:
    """A value other writers change; ``get`` blocks while ``gate`` is clear."""

    def __init__(self) -> None:
        self.value = 0
        self.reads = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def get(self, key: str) -> int:
        self.reads += 1
        self.entered.set()
        assert self.gate.wait(10)
        if key == "broken":
            raise ConnectionError("state database down")
        return self.value


async def test_a_lone_caller_reads_once_and_each_later_caller_reads_again():
    store = Store()
    reads = SharedReads(store.get)
    assert await reads.get("t") == 0
    store.value = 1
    assert await reads.get("t") == 1
    assert store.reads == 2


async def test_callers_arriving_during_a_read_share_the_next_one_and_see_a_later_write():
    store = Store()
    store.gate.clear()
    reads = SharedReads(store.get)
    first = asyncio.create_task(reads.get("t"))
    await asyncio.to_thread(store.entered.wait, 10)  # the first read is in flight
    store.value = 7  # written (and acknowledged) after that read began
    waiting = [asyncio.create_task(reads.get("t")) for _ in range(8)]
    await asyncio.sleep(0.05)
    store.gate.set()
    assert await asyncio.gather(*waiting) == [7] * 8  # none took the first read's value
    await first
    assert store.reads == 2  # the first read and one shared by the eight
    assert reads.shared == 7


async def test_keys_do_not_share_and_errors_reach_every_waiting_caller():
    store = Store()
    store.gate.clear()
    reads = SharedReads(store.get)
    first = asyncio.create_task(reads.get("broken"))
    other = asyncio.create_task(reads.get("t"))
    await asyncio.to_thread(store.entered.wait, 10)
    waiting = [asyncio.create_task(reads.get("broken")) for _ in range(3)]
    await asyncio.sleep(0.05)
    store.gate.set()
    for task in (first, *waiting):
        with pytest.raises(ConnectionError):
            await task
    assert await other == 0


async def test_a_cancelled_caller_does_not_cancel_the_read_others_wait_for():
    store = Store()
    store.gate.clear()
    reads = SharedReads(store.get)
    first = asyncio.create_task(reads.get("t"))
    await asyncio.to_thread(store.entered.wait, 10)
    a = asyncio.create_task(reads.get("t"))
    b = asyncio.create_task(reads.get("t"))
    await asyncio.sleep(0.02)
    a.cancel()
    store.value = 3
    store.gate.set()
    assert await b == 3
    await first  # (it read after the gate opened too)


async def test_a_direct_read_counts_as_a_read():
    reads: SharedReads[str, int] = SharedReads(lambda key: 5, lambda key: 4)
    assert await reads.get("t1") == 4
    assert (reads.reads, reads.direct, reads.shared) == (1, 1, 0)
