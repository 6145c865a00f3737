"""Where one search's time goes in the store: Milvus Lite variants against in-process floors.

Loads the AppStream descriptions (``bench.realtext``, real embeddings) into one team's
collection of the running Milvus Lite server with the gateway's own schema
(``MilvusStore``), the way ingestion writes them (upserts of ``--upsert-batch`` chunks,
``auto_flush_rows`` as configured), then times, sequentially and with the real AppStream
summaries as queries:

* dense and BM25 searches as the gateway sends them (filter, ``OUTPUT_FIELDS``), and the same
  with fewer output fields, without the filter, with a smaller limit;
* Milvus's own ``hybrid_search`` (RRF), a primary-key ``query``, a filtered scalar ``query``;
* the same dense search after ``compact`` and on fresh collections with other index types;
* concurrency: ``--threads`` clients searching at once (does the server serve in parallel?);
* the floors: exact numpy dense top-k over the same vectors, ``bm25s`` over the same texts,
  and the gateway's in-process team index (``deployments.vector_store.memindex``), when present.

    .venv/bin/python -m bench.bench_store --help
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import realtext
from bench.common import environment_info, markdown_table, setup_logging, write_result
from deployments.config import MilvusSettings
from deployments.protocols import SearchFilter
from deployments.vector_store.filter import build_filter_expr
from deployments.vector_store.rows import OUTPUT_FIELDS
from deployments.vector_store.store import MilvusStore
from serve_app.settings import GatewaySettings

logger = logging.getLogger("bench.store")
TEAM = "bench_store_t0"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_store",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--collection", default="bench_store", help="must start with bench_")
    p.add_argument("--queries", type=int, default=100, help="timed queries per variant")
    p.add_argument("--limit", type=int, default=40, help="candidates per search (top_k 10 × 4)")
    p.add_argument("--upsert-batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=8, help="clients of the concurrency row")
    p.add_argument(
        "--index-types", default="FLAT,IVF_FLAT", help="extra fresh collections to compare"
    )
    p.add_argument(
        "--corpus",
        choices=("appstream", "kjv-chapters"),
        default="appstream",
        help="documents: AppStream descriptions, or KJV chapters (long documents, several "
        "200-token chunks each); queries are the AppStream summaries either way",
    )
    p.add_argument("--grow", type=int, default=0, help="add this many KJV verse chunks too")
    p.add_argument(
        "--no-final-flush",
        action="store_true",
        help="leave the rows after the last auto-flush unflushed, as ingestion does",
    )
    p.add_argument("--keep", action="store_true", help="keep the collection at the end")
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def median_ms(fn: Callable[[int], Any], n: int) -> dict[str, float]:
    fn(0)  # warm-up
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2),
        "n": n,
    }


def load(store: MilvusStore, chunks: list, batch: int, flush: bool) -> float:
    t0 = time.perf_counter()
    for start in range(0, len(chunks), batch):
        store.upsert(chunks[start : start + batch])
    if flush:
        store.flush(TEAM)
    return time.perf_counter() - t0


def concurrent_rate(fn: Callable[[int], Any], threads: int, per_thread: int) -> float:
    """Searches per second with ``threads`` clients each running ``per_thread`` calls."""
    barrier = threading.Barrier(threads + 1)

    def worker(offset: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            fn(offset + i)

    pool = [threading.Thread(target=worker, args=(t * per_thread,)) for t in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return threads * per_thread / (time.perf_counter() - t0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = GatewaySettings()
    labeled = realtext.appstream(TEAM)
    docs = labeled.documents
    queries = [labeled.queries[q] for q in sorted(labeled.queries)]
    if args.corpus == "kjv-chapters":
        docs = realtext.kjv_chapters(TEAM)
    chunks = realtext.embed_chunks(
        realtext.build_chunks(docs, settings), settings, name=args.corpus
    )
    if args.grow:
        kjv = realtext.build_chunks(realtext.kjv_documents(TEAM, args.grow), settings)
        chunks += realtext.embed_chunks(kjv, settings, name="kjv")
    queries = queries[: args.queries]
    qvecs = realtext.embed_texts(queries, settings, kind="query", name="appstream-queries")
    if not args.collection.startswith("bench_"):
        raise SystemExit("--collection must start with bench_")
    ms = MilvusSettings(collection=args.collection)
    store = MilvusStore(ms, dim=qvecs.shape[1])
    store.start()
    store.drop()
    rows: list[list[Any]] = []
    result: dict[str, Any] = {"chunks": len(chunks), "queries": len(queries)}
    result["load_s"] = round(load(store, chunks, args.upsert_batch, not args.no_final_flush), 1)
    logger.info("loaded %d chunks in %.1fs", len(chunks), result["load_s"])
    name = store.collection_for(TEAM)
    client = store.conn.client
    expr = build_filter_expr(SearchFilter(team_id=TEAM, visibilities=("public",)))
    dense_params = {"metric_type": "COSINE", "params": {"ef": max(64, args.limit)}}
    n = len(queries)

    def dense(fields: list[str] | None, flt: str | None, limit: int, coll: str = name):
        def call(i: int) -> Any:
            return client.search(
                coll,
                data=[qvecs[i % n].tolist()],
                anns_field="dense",
                filter=flt or "",
                limit=limit,
                search_params=dense_params,
                output_fields=fields,
            )

        return call

    def bm25(fields: list[str] | None, flt: str | None, limit: int):
        def call(i: int) -> Any:
            return client.search(
                name,
                data=[queries[i % n]],
                anns_field="sparse",
                filter=flt or "",
                limit=limit,
                search_params={"metric_type": "BM25"},
                output_fields=fields,
            )

        return call

    def row(what: str, timing: dict[str, float]) -> None:
        logger.info("%s: p50 %.2f ms", what, timing["p50_ms"])
        rows.append([what, timing["p50_ms"], timing["p95_ms"], timing["n"]])
        result.setdefault("rows", {})[what] = timing

    q = args.queries
    row(
        "dense, gateway's filter + OUTPUT_FIELDS",
        median_ms(dense(OUTPUT_FIELDS, expr, args.limit), q),
    )
    row("dense, filter, chunk_id only", median_ms(dense(["chunk_id"], expr, args.limit), q))
    row("dense, no filter, chunk_id only", median_ms(dense(["chunk_id"], None, args.limit), q))
    row("dense, filter, OUTPUT_FIELDS, limit 10", median_ms(dense(OUTPUT_FIELDS, expr, 10), q))
    row(
        "BM25, gateway's filter + OUTPUT_FIELDS",
        median_ms(bm25(OUTPUT_FIELDS, expr, args.limit), q),
    )
    row("BM25, filter, chunk_id only", median_ms(bm25(["chunk_id"], expr, args.limit), q))
    row("BM25, no filter, chunk_id only", median_ms(bm25(["chunk_id"], None, args.limit), q))

    from pymilvus import AnnSearchRequest, RRFRanker

    def hybrid(i: int) -> Any:
        reqs = [
            AnnSearchRequest([qvecs[i % n].tolist()], "dense", dense_params, args.limit, expr=expr),
            AnnSearchRequest(
                [queries[i % n]], "sparse", {"metric_type": "BM25"}, args.limit, expr=expr
            ),
        ]
        return client.hybrid_search(
            name, reqs, RRFRanker(60), limit=args.limit, output_fields=OUTPUT_FIELDS
        )

    row("Milvus hybrid_search (RRF), OUTPUT_FIELDS", median_ms(hybrid, q))
    ids = [c.chunk_id for c in chunks]
    row("primary-key query (1 id)", median_ms(lambda i: client.get(name, ids=[ids[i]]), q))
    row(
        "scalar query doc_id == x",
        median_ms(
            lambda i: client.query(
                name, filter=f'doc_id == "{chunks[i].doc_id}"', output_fields=["chunk_id"]
            ),
            q,
        ),
    )
    per = max(1, q // args.threads)
    seq = median_ms(dense(["chunk_id"], expr, args.limit), q)
    rate = concurrent_rate(dense(["chunk_id"], expr, args.limit), args.threads, per)
    result["concurrency"] = {
        "threads": args.threads,
        "searches_per_s": round(rate, 1),
        "sequential_per_s": round(1000 / seq["p50_ms"], 1),
    }
    rows.append(
        [
            f"dense, {args.threads} concurrent clients: {rate:.1f} searches/s "
            f"(sequential {1000 / seq['p50_ms']:.1f}/s)",
            "–",
            "–",
            args.threads * per,
        ]
    )

    # Compaction: does merging the flushed segments change the per-search cost?
    t0 = time.perf_counter()
    job = client.compact(name)
    for _ in range(600):
        state = client.get_compaction_state(job)
        if str(state).lower().endswith("completed"):
            break
        time.sleep(0.5)
    result["compact_s"] = round(time.perf_counter() - t0, 1)
    row(
        "dense after compact, filter + OUTPUT_FIELDS",
        median_ms(dense(OUTPUT_FIELDS, expr, args.limit), q),
    )
    row(
        "BM25 after compact, filter + OUTPUT_FIELDS",
        median_ms(bm25(OUTPUT_FIELDS, expr, args.limit), q),
    )

    for index_type in [t for t in args.index_types.split(",") if t]:
        other = MilvusStore(
            MilvusSettings(
                collection=f"{args.collection}_{index_type.lower()}", index_type=index_type
            ),
            dim=qvecs.shape[1],
        )
        other.start()
        other.drop()
        other.settings = other.settings.model_copy(update={"auto_flush_rows": 0})
        other.upsert(chunks)
        other.flush(TEAM)
        coll = other.collection_for(TEAM)
        row(
            f"dense, {index_type}, one bulk-loaded segment, filter + OUTPUT_FIELDS",
            median_ms(dense(OUTPUT_FIELDS, expr, args.limit, coll), q),
        )
        row(
            f"dense, {index_type}, one segment, no filter, chunk_id only",
            median_ms(dense(["chunk_id"], None, args.limit, coll), q),
        )
        other.drop()
        other.close()

    # The floors, in this process over the same chunks.
    matrix = np.asarray([c.vector for c in chunks], dtype=np.float32)
    top = args.limit

    def numpy_dense(i: int) -> Any:
        scores = matrix @ qvecs[i % n]
        part = np.argpartition(-scores, top)[:top]
        return part[np.argsort(-scores[part])]

    row("floor: numpy exact dense top-k", median_ms(numpy_dense, q))
    try:
        import bm25s
    except ImportError:
        logger.warning("bm25s not installed (pip install -e '.[bench]'); no BM25 floor")
    else:
        retriever = bm25s.BM25()
        retriever.index(
            bm25s.tokenize([c.text for c in chunks], stopwords=None, show_progress=False),
            show_progress=False,
        )

        def bm25s_search(i: int) -> Any:
            tokens = bm25s.tokenize([queries[i % n]], stopwords=None, show_progress=False)
            return retriever.retrieve(tokens, k=top, show_progress=False, n_threads=1)

        row("floor: bm25s top-k", median_ms(bm25s_search, q))
    from deployments.vector_store.filter import compile_filter
    from deployments.vector_store.memindex.team import TeamIndex

    index = TeamIndex(dim=matrix.shape[1])
    index.upsert(chunks)
    compiled = compile_filter(SearchFilter(team_id=TEAM, visibilities=("public",)))

    def memory(method: str) -> Callable[[int], Any]:
        def call(i: int) -> Any:
            return index.search(
                method, compiled, top, query_text=queries[i % n], query_vector=qvecs[i % n]
            )

        return call

    row(
        "gateway's in-memory index (TeamIndex): dense, filter, records",
        median_ms(memory("dense"), q),
    )
    row(
        "gateway's in-memory index (TeamIndex): BM25, filter, records", median_ms(memory("bm25"), q)
    )
    result["table_markdown"] = markdown_table(["what", "p50 ms", "p95 ms", "n"], rows)
    if not args.keep:
        store.drop()
    store.close()
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    result = {"benchmark": "store", "args": vars(args), "environment": environment_info()}
    result.update(run(args))
    write_result("store", result, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
