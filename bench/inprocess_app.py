"""The gateway's whole FastAPI app in one process (``bench_inprocess --what app``): no HTTP
server, no Ray, no proxy, so what a search costs in the app itself — middleware, routing,
the body, auth, the rate limit, the search service, the response — apart from the HTTP legs
around it.

The app is the one ``create_app`` builds for the Ingress, over the same parts the Ingress
holds: the query model in this process (``InlineQueryEmbedder``, one thread), the in-memory
index of the chunks (``TeamIndex`` with the Ingress's scan: its threads while the app is idle
and the int8 first pass), JWT auth (HS256), the semantic
cache on a SQLite state database in a temporary folder, the audit log, the default settings.
Requests go straight into the ASGI app, one at a time with ``--gap-ms`` between them (a
c=1 client's round trip), each query once per round (a round's queries carry a suffix, so
no round answers from an earlier one's cache entries). Each request's ``Server-Timing``
stages are kept, and the time before the search service starts (middleware, routing, the
body, dependencies: auth and the rate limit) and after it returns (the response's JSON and
its sending).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batch_ingest.source_store import SourceStore
from bench.bench_plumbing import corpus
from deployments.models.embedding import InlineQueryEmbedder
from deployments.protocols import Backends, SearchFilter, SearchHit
from deployments.testing.fakes import FakeVectorStore
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.scan import DenseScan
from deployments.vector_store.memindex.team import TeamIndex
from serve_app.asgi import create_app
from serve_app.composition import build_services
from serve_app.search.service import SearchService
from serve_app.settings import GatewaySettings
from serve_app.testing import claims, jwt_auth, mint
from serve_app.timing import InFlight


class IndexStore(FakeVectorStore):
    """The vector store of the app: candidates from one ``TeamIndex`` (what the Ingress's
    memory index answers for a loaded, in-sync team), the rest of the fake's contract."""

    def __init__(self, index: TeamIndex) -> None:
        super().__init__()
        self.index = index

    async def candidates(  # type: ignore[override]
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str = "",
        query_lexical: Any = None,
        **_: Any,
    ) -> dict[str, list[SearchHit]]:
        return self.index.search_methods(
            methods, compile_filter(flt), limit, query_text=query_text, query_vector=query_vector
        )


async def post(app: Any, path: str, body: bytes, token: str) -> tuple[int, dict[bytes, bytes]]:
    """One POST straight into the ASGI app: its status and response headers."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"authorization", b"Bearer " + token.encode()),
        ],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # no disconnect while the app runs
        raise AssertionError("unreachable")

    answer: dict[str, Any] = {}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = dict(message["headers"])

    await app(scope, receive, send)
    return answer["status"], answer["headers"]


def _service_clock(marks: dict[str, float]) -> Callable[[], None]:
    """Wrap ``SearchService.search_docs`` to stamp when it starts and returns; the undo."""
    original = SearchService.search_docs

    async def stamped(self: SearchService, *args: Any, **kwargs: Any) -> Any:
        marks["service_in"] = time.perf_counter()
        try:
            return await original(self, *args, **kwargs)
        finally:
            marks["service_out"] = time.perf_counter()

    SearchService.search_docs = stamped  # type: ignore[method-assign]

    def undo() -> None:
        SearchService.search_docs = original  # type: ignore[method-assign]

    return undo


@dataclass
class BuiltApp:
    """The Ingress's app over one process's index and model, and what a client needs."""

    app: Any
    embedder: InlineQueryEmbedder
    queries: list[tuple[str, str]]
    token: str


def build_app(args: argparse.Namespace) -> BuiltApp:
    """The app ``create_app`` builds for the Ingress, over ``args.chunks`` chunks in a
    ``TeamIndex`` of this process, the query model, JWT auth and a SQLite state database."""
    import torch

    torch.set_num_threads(1)  # as in a Ray replica: the int8 first pass runs
    folder = tempfile.mkdtemp(prefix="bench_app_")
    settings = GatewaySettings(auth=jwt_auth(), state={"url": f"sqlite:///{folder}/state.db"})
    _, chunks, queries = corpus(args, settings)
    # The scan as the Ingress's memory index makes it (deployments/vector_store/memindex/
    # front.py): its threads while the app is idle, the int8 first pass, BM25's k1 and b.
    in_flight = InFlight()
    mem, milvus = settings.milvus.memory_index, settings.milvus
    scan = DenseScan(mem.scan_threads, in_flight.busy, mem.int8_first_pass)
    index = TeamIndex(
        dim=len(chunks[0].vector),
        metric=milvus.metric_type,
        k1=milvus.bm25_k1,
        b=milvus.bm25_b,
        scan=scan,
    )
    index.upsert(chunks)
    index.prepare_scan()
    # As the Ingress's loader does once a team is in memory (memindex/loader.py): the index's
    # objects out of the cyclic collector's sight (without it, one full collection of
    # ~250 ms per ~600 searches here).
    gc.freeze()
    embedder = InlineQueryEmbedder(settings.embedder, busy=in_flight.busy)
    store = IndexStore(index)
    services = build_services(
        settings,
        Backends(embedder=embedder, store=store, graph=None),
        sources=SourceStore(settings.state.url),
    )
    app = create_app(services, in_flight=in_flight)
    token = mint(claims(teams={args.team: ["member"]}, exp=int(time.time()) + 86_400))
    return BuiltApp(app, embedder, queries, token)


def bench_app(args: argparse.Namespace) -> dict[str, Any]:
    """Per round: the request's p50 ms, the p50 of each ``Server-Timing`` stage, and of the
    time before and after the search service."""
    built = build_app(args)
    marks: dict[str, float] = {}
    undo = _service_clock(marks)
    try:
        return asyncio.run(
            _rounds(built.app, built.embedder, built.queries, built.token, marks, args)
        )
    finally:
        undo()


async def _rounds(
    app: Any,
    embedder: InlineQueryEmbedder,
    queries: list[tuple[str, str]],
    token: str,
    marks: dict[str, float],
    args: argparse.Namespace,
) -> dict[str, Any]:
    embedder.start_loading()

    def body(query: str) -> bytes:
        return json.dumps({"team_id": args.team, "query": query, "top_k": args.top_k}).encode()

    async def search(payload: bytes) -> tuple[int, dict[bytes, bytes]]:
        return await post(app, "/rag/search_docs", payload, token)

    status, _ = await search(body("warm up"))
    if status != 200:
        raise RuntimeError(f"the app answered {status} to a search")
    out: dict[str, Any] = {"p50_ms": [], "stages_p50_ms": []}
    for round_no in range(args.rounds):
        took: list[float] = []
        parts: dict[str, list[float]] = {}
        for _, query in queries:
            started = time.perf_counter()
            status, headers = await search(body(f"{query} r{round_no}" if round_no else query))
            ended = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"the app answered {status} to {query!r}")
            took.append((ended - started) * 1000)
            parts.setdefault("before_service", []).append((marks["service_in"] - started) * 1000)
            parts.setdefault("after_service", []).append((ended - marks["service_out"]) * 1000)
            for part in headers.get(b"server-timing", b"").decode().split(", "):
                name, _, ms = part.partition(";dur=")
                if ms:
                    parts.setdefault(name, []).append(float(ms))
            await asyncio.sleep(args.gap_ms / 1000)
        out["p50_ms"].append(round(statistics.median(took), 3))
        out["stages_p50_ms"].append({k: round(statistics.median(v), 3) for k, v in parts.items()})
    return out
