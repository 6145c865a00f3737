"""Spilled search queries coalesced into fewer Embedder calls (deployments/models/coalesce.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from deployments.models.coalesce import CoalescedQueries
from deployments.protocols import Encoded


class GatedEmbedder:
    """Each call waits for ``gate``; a text's vector is its length, so answers can be told
    apart. Texts starting with ``fail`` fail their call."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls: list[list[str]] = []

    async def encode(self, texts: list[str], kind: str = "passage") -> Encoded:
        assert kind == "query"
        self.calls.append(list(texts))
        await self.gate.wait()
        if any(t.startswith("fail") for t in texts):
            raise RuntimeError("embedder: boom")
        return Encoded(np.array([[float(len(t))] for t in texts], dtype=np.float32))


async def test_a_lone_query_goes_at_once_as_a_call_of_one():
    target = GatedEmbedder()
    target.gate.set()
    coalesced = CoalescedQueries(target)
    assert (await coalesced.encode("solar")).dense.tolist() == [[5.0]]
    assert target.calls == [["solar"]]


async def test_queries_arriving_during_a_call_go_together_in_the_next():
    target = GatedEmbedder()
    coalesced = CoalescedQueries(target, max_calls=1)
    first = asyncio.create_task(coalesced.encode("a"))
    await asyncio.sleep(0)
    later = [asyncio.create_task(coalesced.encode("b" * n)) for n in (2, 3, 4)]
    await asyncio.sleep(0.01)
    assert target.calls == [["a"]]  # the others wait for it
    target.gate.set()
    assert (await first).dense.tolist() == [[1.0]]
    assert [(await t).dense.tolist() for t in later] == [[[2.0]], [[3.0]], [[4.0]]]
    assert target.calls == [["a"], ["bb", "bbb", "bbbb"]]
    assert coalesced.status() == {"calls": 2, "texts_per_call": 2.0}


async def test_a_call_that_fails_fails_only_its_own_queries():
    target = GatedEmbedder()
    coalesced = CoalescedQueries(target, max_calls=1)
    failing = asyncio.create_task(coalesced.encode("fail me"))
    await asyncio.sleep(0)
    fine = asyncio.create_task(coalesced.encode("fine"))
    target.gate.set()
    with pytest.raises(RuntimeError, match="boom"):
        await failing
    assert (await fine).dense.tolist() == [[4.0]]


async def test_a_caller_that_gives_up_leaves_the_others_their_answers():
    target = GatedEmbedder()
    coalesced = CoalescedQueries(target, max_calls=1)
    first = asyncio.create_task(coalesced.encode("a"))
    await asyncio.sleep(0)
    gone = asyncio.create_task(coalesced.encode("gone"))
    kept = asyncio.create_task(coalesced.encode("kept!"))
    await asyncio.sleep(0)
    gone.cancel()
    target.gate.set()
    assert (await first).dense.tolist() == [[1.0]]
    assert (await kept).dense.tolist() == [[5.0]]
    assert gone.cancelled()


async def test_no_call_holds_more_than_max_texts():
    target = GatedEmbedder()
    coalesced = CoalescedQueries(target, max_calls=1, max_texts=2)
    tasks = [asyncio.create_task(coalesced.encode(str(i))) for i in range(5)]
    await asyncio.sleep(0)
    target.gate.set()
    await asyncio.gather(*tasks)
    assert [len(c) for c in target.calls] == [2, 2, 1]


async def test_by_default_two_calls_go_at_once_and_the_rest_wait_for_one():
    """Two calls on their way keep the Embedder busy while one's answer travels back (one
    alone made 37 req/s at c=8 against 40 without coalescing; two made 48)."""
    target = GatedEmbedder()
    coalesced = CoalescedQueries(target)
    first = asyncio.create_task(coalesced.encode("a"))
    await asyncio.sleep(0)
    second = asyncio.create_task(coalesced.encode("bb"))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(coalesced.encode("c" * n)) for n in (3, 4)]
    await asyncio.sleep(0.01)
    assert target.calls == [["a"], ["bb"]]
    target.gate.set()
    got = await asyncio.gather(first, second, *rest)
    assert [g.dense.tolist() for g in got] == [[[1.0]], [[2.0]], [[3.0]], [[4.0]]]
    assert target.calls == [["a"], ["bb"], ["ccc", "cccc"]]
