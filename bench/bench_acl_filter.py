"""What document-ACL filters cost a search, same run, same data, interleaved.

The AppStream descriptions (``bench.realtext``: 2,126 documents, 2,365 chunks, real MiniLM
embeddings) queried by their summaries, in one process, on both store paths of the
Retriever:

* **in-memory index** (``TeamIndex``, the default path): dense and BM25 top-k with the
  filter's row mask recomputed every query (``--no-mask-cache``: what the first search after
  a write pays; with the cache the mask is built once per filter and change);
* **Milvus** (``MilvusStore.search``, the fallback and the path with the index off): dense
  and BM25 with the gateway's expression.

Each query runs three ways, interleaved (so drift hits all alike): *no ACL term* (the
expression of a collection built before ACLs), *open* (every chunk ``["*"]``, the caller's
tokens: the term always present now) and *acl* (``--share`` of the documents restricted to a
group the reader holds, a denied group it does not; the reader holds three groups: allow and
deny terms both evaluated, same answers).

    .venv/bin/python -m bench.bench_acl_filter --queries 300
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from dataclasses import replace
from typing import Any

from bench import realtext
from bench.common import environment_info, markdown_table, setup_logging, write_result
from deployments.acl import principal_tokens
from deployments.protocols import SearchFilter
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.team import TeamIndex
from deployments.vector_store.store import MilvusStore
from serve_app.settings import GatewaySettings

logger = logging.getLogger("bench.acl_filter")
TEAM = "bench_acl_t0"
READER = principal_tokens("bench-agent", ["bench_readers", "bench_analysts", "bench_ops"])


def timed(call: Any) -> float:
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1000


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = GatewaySettings()
    labeled = realtext.appstream(TEAM)
    chunks = realtext.embed_chunks(
        realtext.build_chunks(labeled.documents, settings), settings, name="appstream"
    )
    acl_chunks = realtext.with_acls(chunks, args.share)
    queries = [labeled.queries[q] for q in sorted(labeled.queries)][: args.queries]
    vectors = realtext.embed_texts(queries, settings, kind="query", name="appstream-queries")
    limit = args.top_k * settings.search.candidate_multiplier
    open_flt = SearchFilter(team_id=TEAM, acl_principals=READER)
    compiled = compile_filter(open_flt)

    indexes = {}
    for name, rows in (("open", chunks), ("acl", acl_chunks)):
        index = TeamIndex(
            dim=len(chunks[0].vector),
            metric=settings.milvus.metric_type,
            k1=settings.milvus.bm25_k1,
            b=settings.milvus.bm25_b,
        )
        index.upsert(rows)
        indexes[name] = index
    no_acl = replace(compiled, terms=tuple(t for t in compiled.terms if "acl" not in t.field))

    milvus_settings = settings.milvus.model_copy(update={"collection": args.collection})
    stores = {}
    for name, rows in (("open", chunks), ("acl", acl_chunks)):
        store = MilvusStore(
            milvus_settings.model_copy(update={"collection": f"{args.collection}_{name}"}),
            dim=len(chunks[0].vector),
        )
        store.start()
        store.drop()
        for start in range(0, len(rows), 256):
            store.upsert(rows[start : start + 256])
        store.flush()
        stores[name] = store
    variants = {
        "no ACL term": ("open", no_acl, False),
        "open (term present)": ("open", compiled, True),
        f"acl ({args.share:.0%} of docs)": ("acl", compiled, True),
    }
    paths = ("memory dense", "memory bm25", "milvus dense", "milvus bm25")
    times: dict[str, dict[str, list[float]]] = {path: {v: [] for v in variants} for path in paths}
    answers: dict[str, list[list[str]]] = {v: [] for v in variants}
    for i, (query, vector) in enumerate(zip(queries, vectors, strict=True)):
        for variant, (which, flt, acl) in variants.items():
            index, store = indexes[which], stores[which]
            if not args.mask_cache:
                index._masks.clear()
            qv = [float(x) for x in vector]
            t = timed(lambda: index.search("dense", flt, limit, query_vector=qv))  # noqa: B023
            times["memory dense"][variant].append(t)
            if not args.mask_cache:
                index._masks.clear()
            t = timed(lambda: index.search("bm25", flt, limit, query_text=query))  # noqa: B023
            times["memory bm25"][variant].append(t)
            expr_flt = open_flt if acl else replace(open_flt, acl_principals=("*",))
            # acl False: the expression and fields of a collection without the ACL fields.
            store.shapes._seen[store.collection_for(TEAM)] = (acl, False, time.monotonic())
            hits: list[Any] = []
            t = timed(lambda: hits.extend(store.search(query, qv, expr_flt, limit, "dense")))  # noqa: B023
            times["milvus dense"][variant].append(t)
            t = timed(lambda: store.search(query, None, expr_flt, limit, "bm25"))  # noqa: B023
            times["milvus bm25"][variant].append(t)
            answers[variant].append([h.chunk.chunk_id for h in hits[: args.top_k]])
        if (i + 1) % 100 == 0:
            logger.info("%d/%d queries", i + 1, len(queries))
    for store in stores.values():
        store.drop()
        store.close()
    warm = 10
    medians = {
        path: {v: round(statistics.median(ts[warm:]), 3) for v, ts in per.items()}
        for path, per in times.items()
    }
    base = "no ACL term"
    same = {
        v: sum(a == b for a, b in zip(answers[base], answers[v], strict=True)) for v in variants
    }
    return {
        "chunks": len(chunks),
        "acl_chunks": sum(1 for c in acl_chunks if c.acl_deny),
        "queries": len(queries),
        "mask_cache": args.mask_cache,
        "medians_ms": medians,
        "ratios_vs_no_acl": {
            path: {v: round(m / per[base], 3) for v, m in per.items()}
            for path, per in medians.items()
        },
        "milvus_dense_same_top_k_as_no_acl": same,
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    for path, per in result["medians_ms"].items():
        for variant, ms in per.items():
            rows.append([path, variant, ms, f"{result['ratios_vs_no_acl'][path][variant]:.2f}×"])
    return markdown_table(["path", "filter", "p50 ms", "vs no ACL term"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_acl_filter", description=__doc__)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--share", type=float, default=0.3)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--collection", default="bench_acl")
    p.add_argument(
        "--no-mask-cache",
        dest="mask_cache",
        action="store_false",
        help="rebuild the in-memory row mask every query (the first search after a write)",
    )
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    setup_logging(args.verbose)
    result = {"benchmark": "acl_filter", "args": vars(args), "environment": environment_info()}
    result |= run(args)
    result["table_markdown"] = render(result)
    path = write_result("acl_filter", result, args.out)
    print(result["table_markdown"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
