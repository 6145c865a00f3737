"""SplitEmbedder (search queries embedded in the ingress, passages by the Embedder
deployment) and where ``embedder.query_location`` puts the queries."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from deployments.config import EmbedderSettings
from deployments.models.embedding import InlineQueryEmbedder, SplitEmbedder
from deployments.protocols import Encoded


class Recording:
    def __init__(self, name: str, ready: bool = True) -> None:
        self.name = name
        self.ready = ready
        self.calls: list[tuple[list[str], str]] = []

    async def embed(self, texts: list[str], kind: str = "passage") -> Any:
        self.calls.append((list(texts), kind))
        return np.zeros((len(texts), 3), dtype=np.float32)

    async def encode(self, texts: list[str], kind: str = "passage") -> Encoded:
        return Encoded(await self.embed(texts, kind))

    async def status(self) -> dict[str, Any]:
        return {"ready": self.ready, "model": "m@1", "dim": 3, "who": self.name}


def test_queries_and_passages_go_to_their_own_embedder():
    queries, passages = Recording("q"), Recording("p")
    split = SplitEmbedder(queries=queries, passages=passages)
    asyncio.run(split.embed(["what is milvus"], "query"))
    asyncio.run(split.embed(["a passage", "another"], "passage"))
    asyncio.run(split.embed(["default kind"]))
    assert queries.calls == [(["what is milvus"], "query")]
    assert passages.calls == [(["a passage", "another"], "passage"), (["default kind"], "passage")]


@pytest.mark.parametrize(("q_ready", "p_ready"), [(True, True), (False, True), (True, False)])
def test_status_is_ready_only_when_both_are(q_ready, p_ready):
    split = SplitEmbedder(queries=Recording("q", q_ready), passages=Recording("p", p_ready))
    status = asyncio.run(split.status())
    assert status["ready"] is (q_ready and p_ready)
    assert status["who"] == "p"
    assert status["queries"] == {
        "location": "ingress",
        "local_slots": 1,
        "local": 0,
        "spilled": 0,
        "spilled_calls": {"calls": 0, "texts_per_call": 0},
        "ready": q_ready,
        "model": "m@1",
        "dim": 3,
        "who": "q",
    }


class Gated(Recording):
    """Holds each query until released, so callers overlap."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = asyncio.Event()

    async def embed(self, texts: list[str], kind: str = "passage") -> Any:
        await self.release.wait()
        return await super().embed(texts, kind)


@pytest.mark.parametrize("slots", [1, 2])
def test_queries_beyond_the_local_slots_spill_to_the_shared_embedder(slots):
    async def scenario():
        local, shared = Gated("q"), Recording("p")
        split = SplitEmbedder(queries=local, passages=shared, local_slots=slots)
        held = [asyncio.create_task(split.embed([f"held {i}"], "query")) for i in range(slots)]
        await asyncio.sleep(0)
        await split.embed(["while busy"], "query")  # answered by the shared embedder
        assert shared.calls == [(["while busy"], "query")]
        local.release.set()
        await asyncio.gather(*held)
        await split.embed(["free again"], "query")
        assert [c[0][0] for c in local.calls] == [f"held {i}" for i in range(slots)] + [
            "free again"
        ]
        status = await split.status()
        assert (status["queries"]["local"], status["queries"]["spilled"]) == (slots + 1, 1)

    asyncio.run(scenario())


def test_a_query_in_flight_at_the_shared_embedder_counts_too():
    async def scenario():
        local, shared = Gated("q"), Gated("p")
        split = SplitEmbedder(queries=local, passages=shared, local_slots=1)
        first = asyncio.create_task(split.embed(["first"], "query"))  # local
        await asyncio.sleep(0)
        second = asyncio.create_task(split.embed(["second"], "query"))  # shared
        await asyncio.sleep(0)
        local.release.set()
        await first
        # The local model is free, but "second" is still being embedded by the shared one.
        third = asyncio.create_task(split.embed(["third"], "query"))
        await asyncio.sleep(0)
        shared.release.set()
        await asyncio.gather(second, third)
        assert [c[0] for c in local.calls] == [["first"]]
        # Two calls of spilled queries may be on their way at once (coalesce.py): either
        # may reach the shared embedder first.
        assert sorted(c[0] for c in shared.calls) == [["second"], ["third"]]

    asyncio.run(scenario())


def test_a_failed_local_query_frees_its_slot():
    class Failing(Recording):
        async def embed(self, texts, kind="passage"):
            raise RuntimeError("model crashed")

    split = SplitEmbedder(queries=Failing("q"), passages=Recording("p"))
    for _ in range(2):  # the second query is local again (and fails again): the slot is free
        with pytest.raises(RuntimeError):
            asyncio.run(split.embed(["boom"], "query"))
    assert split.passages.calls == []


@pytest.mark.parametrize(
    ("location", "device", "in_ingress"),
    [
        ("auto", "cpu", True),
        ("auto", "cuda", False),
        ("auto", "cuda:1", False),
        ("ingress", "cuda", True),
        ("embedder", "cpu", False),
    ],
)
def test_query_location_resolves_by_device(location, device, in_ingress):
    settings = EmbedderSettings(query_location=location, device=device)
    assert settings.queries_in_ingress is in_ingress


def test_query_location_rejects_unknown_values():
    with pytest.raises(ValueError, match="query_location"):
        EmbedderSettings(query_location="proxy")


def test_the_inline_query_embedder_gives_the_cores_vectors():
    from deployments.models.embedding import EmbedderCore, InlineQueryEmbedder

    async def scenario():
        inline = InlineQueryEmbedder(EmbedderSettings())
        inline.start_loading()
        got = await inline.embed(["which vector database do we use?"], "query")
        return got, await inline.status()

    got, status = asyncio.run(scenario())
    core = EmbedderCore(EmbedderSettings())
    want = core.embed(["which vector database do we use?"], "query")
    assert np.allclose(got, want, atol=1e-6)
    assert status["ready"] is True and status["error"] is None
    assert status["timing"]["query_inline_n"] == 1


def test_the_inline_query_embedder_reports_a_model_that_fails_to_load(tmp_path):
    from deployments.errors import BackendUnavailable
    from deployments.models.embedding import InlineQueryEmbedder

    inline = InlineQueryEmbedder(EmbedderSettings(model_path=str(tmp_path / "nowhere")))
    with pytest.raises(BackendUnavailable, match="failed to load"):
        asyncio.run(inline.embed(["q"], "query"))
    status = asyncio.run(inline.status())
    assert status["ready"] is False and status["error"]


def test_a_query_goes_to_the_shared_embedder_while_the_process_is_busy():
    busy = [False]
    local, shared = Recording("q"), Recording("p")
    split = SplitEmbedder(queries=local, passages=shared, busy=lambda: busy[0])
    asyncio.run(split.embed(["alone"], "query"))
    busy[0] = True
    asyncio.run(split.embed(["in a crowd"], "query"))
    assert [c[0] for c in local.calls] == [["alone"]]
    assert [c[0] for c in shared.calls] == [["in a crowd"]]


def test_queries_spilled_while_one_is_on_its_way_go_to_the_shared_embedder_together():
    class Slow(Recording):
        async def embed(self, texts: list[str], kind: str = "passage") -> Any:
            await asyncio.sleep(0.02)
            return await super().embed(texts, kind)

    async def crowd(split: SplitEmbedder) -> list[Any]:
        return await asyncio.gather(*(split.embed([f"q{i}"], "query") for i in range(5)))

    # Five searches at once: with coalescing, one call of five (each gets its own row).
    for coalesce, calls in ((True, [[f"q{i}" for i in range(5)]]), (False, None)):
        shared = Slow("p")
        split = SplitEmbedder(
            queries=Recording("q"), passages=shared, busy=lambda: True, coalesce_spilled=coalesce
        )
        got = asyncio.run(crowd(split))
        assert [v.shape for v in got] == [(1, 3)] * 5
        want = calls or [[f"q{i}"] for i in range(5)]
        assert [c[0] for c in shared.calls] == want


def test_with_no_spill_a_lone_query_stays_local_however_busy_but_a_batch_does_not():
    local, shared = Recording("q"), Recording("p")
    split = SplitEmbedder(queries=local, passages=shared, busy=lambda: True, spill_when_busy=False)
    asyncio.run(split.embed(["in a crowd"], "query"))
    asyncio.run(split.embed(["claim one", "claim two"], "query"))  # enrich's claims
    asyncio.run(split.embed(["a passage"], "passage"))
    assert [c[0] for c in local.calls] == [["in a crowd"]]
    assert [c[0] for c in shared.calls] == [["claim one", "claim two"], ["a passage"]]


@pytest.mark.parametrize(
    ("spill", "backend", "quantize", "when_busy"),
    [
        ("auto", "auto", "auto", False),  # the packaged MiniLM on a CPU: ONNX int8
        ("auto", "onnx", "none", True),
        ("auto", "transformers", "none", True),
        ("when_busy", "auto", "auto", True),
        ("never", "transformers", "none", False),
    ],
)
def test_query_spill_resolves_by_the_query_models_speed(spill, backend, quantize, when_busy):
    settings = EmbedderSettings(query_spill=spill, backend=backend, quantize=quantize)
    assert settings.spills_queries_when_busy is when_busy


def test_the_in_flight_middleware_counts_requests_in_progress():
    import httpx
    from fastapi import FastAPI

    from serve_app.timing import CountInFlight, InFlight

    gauge = InFlight()
    seen: list[tuple[int, bool]] = []
    app = FastAPI()
    app.add_middleware(CountInFlight, gauge=gauge)

    @app.get("/")
    async def root() -> dict:
        await asyncio.sleep(0.05)  # the three concurrent requests overlap here
        seen.append((gauge.count, gauge.busy()))
        return {}

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await client.get("/")
            await asyncio.gather(*(client.get("/") for _ in range(3)))

    asyncio.run(scenario())
    assert seen[0] == (1, False)  # alone: not busy
    assert seen[1] == (3, True)  # the first of three concurrent ones sees all three
    assert gauge.count == 0  # every request left


class ThreadCore:
    """A loaded core that records the thread of each encode and how many ran at once; an
    encode of ``hold`` waits for ``release``."""

    def __init__(self) -> None:
        self.loaded = True
        self.threads: list[str] = []
        self.running = 0
        self.most = 0
        self.release = threading.Event()
        self.started = threading.Event()
        self._lock = threading.Lock()

    def encode(self, texts: list[str], kind: str) -> Any:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.threads.append(threading.current_thread().name)
        try:
            if texts == ["hold"]:
                self.started.set()
                assert self.release.wait(5)
            return Encoded(np.zeros((len(texts), 3), dtype=np.float32))
        finally:
            with self._lock:
                self.running -= 1


def _inline(busy: list[bool], query_thread: str = "when_busy") -> Any:
    inline = InlineQueryEmbedder(EmbedderSettings(query_thread=query_thread), busy=lambda: busy[0])
    inline.core = ThreadCore()  # type: ignore[assignment]
    return inline


def test_a_query_is_embedded_on_the_loop_alone_and_in_the_worker_thread_when_busy():
    busy = [False]
    inline = _inline(busy)

    async def scenario():
        await inline.embed(["alone"], "query")
        busy[0] = True
        await inline.embed(["in a crowd"], "query")

    asyncio.run(scenario())
    loop_thread = threading.current_thread().name
    assert inline.core.threads[0] == loop_thread
    assert inline.core.threads[1].startswith("query-embed")
    timing = inline._timing.snapshot()
    assert timing["query_inline_n"] == 1 and timing["query_thread_n"] == 1


def test_with_query_thread_never_a_busy_process_embeds_on_its_loop():
    inline = _inline([True], query_thread="never")
    asyncio.run(inline.embed(["in a crowd"], "query"))
    assert inline.core.threads == [threading.current_thread().name]


def test_the_model_never_runs_on_the_loop_and_in_the_thread_at_once():
    # A query that arrives while the thread still holds one queues behind it, even when the
    # process looks quiet again, and even when the caller of the first stopped waiting
    # (a deadline): the thread is free only once its encode returned.
    busy = [True]
    inline = _inline(busy)

    async def scenario():
        first = asyncio.create_task(inline.embed(["hold"], "query"))
        await asyncio.to_thread(inline.core.started.wait, 5)
        first.cancel()  # the caller gives up; the thread is still encoding
        with pytest.raises(asyncio.CancelledError):
            await first
        busy[0] = False
        second = asyncio.create_task(inline.embed(["quiet now"], "query"))
        await asyncio.sleep(0.05)
        assert not second.done()  # queued behind the held encode, not run on the loop
        inline.core.release.set()
        await second
        await asyncio.sleep(0)  # the thread's done-callbacks
        third = await inline.embed(["alone at last"], "query")
        return third

    asyncio.run(scenario())
    assert inline.core.most == 1
    assert [t.startswith("query-embed") for t in inline.core.threads] == [True, True, False]


@pytest.mark.parametrize(
    ("setting", "backend", "quantize", "coalesces"),
    [
        ("auto", "transformers", "none", True),  # torch: a pass of 8 costs ~half a query
        ("auto", "onnx", "none", False),  # ONNX: batched queries cost more per query
        ("auto", "auto", "auto", False),  # the packaged MiniLM on a CPU: ONNX int8
        ("always", "onnx", "none", True),
        ("never", "transformers", "none", False),
    ],
)
def test_coalescing_spilled_queries_resolves_by_the_runtime(setting, backend, quantize, coalesces):
    settings = EmbedderSettings(coalesce_spilled=setting, backend=backend, quantize=quantize)
    assert settings.coalesces_spilled_queries is coalesces
