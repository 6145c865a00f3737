"""Hybrid search_docs on real text: the gateway against the floor of the hardware, same run.

1. Starts the gateway (``bench.serve_harness``; JWT auth by default, the app's default
   hybrid search) and writes the AppStream descriptions (``bench.realtext``: 2,126 documents,
   2,365 chunks, real MiniLM embeddings) of one team straight into Milvus through
   ``MilvusStore`` — another process than the Retriever, as the bus consumer is.
2. The floor, in this process over the same chunks and queries: one query embedding
   (``EmbedderCore``, the deployment's settings: 1 torch thread) + an exact numpy dense top-k
   + a ``bm25s`` top-k, sequential; measured before and after the gateway's phase (the
   machine's speed drifts by ±20 % over minutes), medians over both passes' queries.
3. ``POST /rag/search_docs`` with the AppStream summaries as queries (``top_k`` 10), closed
   loop at each ``--concurrency`` level, ``--reps`` repetitions: client p50/p95, requests/s,
   the server's ``took_ms`` and its ``Server-Timing`` stages; nDCG@10 of the answers.
4. ``--grow N``: KJV verses are added to the same team until it holds N times the chunks;
   the floor and the searches again.
5. ``--compare-off``: the app redeployed with the in-memory index off (every search in
   Milvus) and measured the same way.
6. ``--acl-share F``: that share of the documents carries a document ACL (allowed group
   ``bench_readers``, denied group ``bench_contractors``) and the reader's token holds
   ``bench_readers`` and two other groups: every search then evaluates the allow and deny
   terms over token arrays while the answers stay the same (the reader may read every
   document), so p50 and nDCG compare with a run without ``--acl-share``.

    .venv/bin/python -m bench.bench_search_real --help
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from typing import Any

import httpx
import numpy as np

from bench import realtext
from bench.common import (
    DEFAULT_PORT,
    Progress,
    closed_loop,
    environment_info,
    latency_summary,
    markdown_table,
    parse_int_list,
    setup_logging,
)
from bench.quality.metrics import distinct, evaluate
from bench.serve_harness import ServeHarness, run_benchmark

logger = logging.getLogger("bench.search_real")
SECRET = "bench-search-real-hs256-secret-0123456789abcdef"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_search_real",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--collection", default="bench_real", help="must start with bench_")
    p.add_argument("--team", default="bench_real_t0")
    p.add_argument("--concurrency", type=parse_int_list, default="1,8")
    p.add_argument("--requests", type=parse_int_list, default="200,400", help="per level")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument(
        "--ndcg-queries",
        type=int,
        default=60,
        help="nDCG@10 over this many first queries (the same set in every phase and level)",
    )
    p.add_argument("--auth", choices=("jwt", "dev"), default="jwt")
    p.add_argument("--grow", type=int, default=10, help="then grow the team N× (0: skip)")
    p.add_argument("--compare-off", action="store_true", help="also with the memory index off")
    p.add_argument("--off-requests", type=parse_int_list, default="60,120")
    p.add_argument("--floor-queries", type=int, default=200)
    p.add_argument(
        "--after-ingest",
        type=int,
        default=30,
        help="ingest a document through the API, then search at once; this many times",
    )
    p.add_argument("--flush", action="store_true", help="flush Milvus after writing")
    p.add_argument(
        "--acl-share",
        type=float,
        default=0.0,
        help="share of documents with a document ACL the reader passes (0: none)",
    )
    p.add_argument(
        "--serve-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment of the Ray cluster (Serve tuning flags), repeatable",
    )
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


READER_GROUPS = ["bench_readers", "bench_analysts", "bench_ops"]


def token(team: str, settings: Any, role: str = "member") -> str:
    import jwt

    now = int(time.time())
    claims: dict[str, Any] = {"sub": "bench-agent", "iat": now, "exp": now + 86_400}
    claims[settings.auth.claims.teams] = {team: [role]}
    claims[settings.auth.claims.groups] = READER_GROUPS
    return jwt.encode(claims, SECRET, "HS256")


async def after_ingest(h: ServeHarness, args: argparse.Namespace, n: int) -> dict[str, Any]:
    """``n`` times: ingest one new KJV chapter through ``POST /ingest/documents``, then at
    once search for a phrase of it. The search must find the new document (the memory index
    replays the change, never rebuilds the team) and its latency is reported."""
    chapters = realtext.kjv_chapters(args.team, 1189)[-n:]
    writer = {"authorization": f"Bearer {token(args.team, h.settings, 'owner')}"}
    reader = {"authorization": f"Bearer {token(args.team, h.settings)}"}
    latencies, found = [], 0
    async with httpx.AsyncClient(base_url=h.base_url, timeout=120.0) as client:
        for doc in chapters:
            doc = {**doc, "doc_id": f"fresh-{doc['doc_id']}"}
            resp = await client.post("/ingest/documents", json={"documents": [doc]}, headers=writer)
            resp.raise_for_status()
            phrase = " ".join(doc["text"].split()[5:17])
            t0 = time.perf_counter()
            resp = await client.post("/rag/search_docs", json=body(args, phrase), headers=reader)
            latencies.append(time.perf_counter() - t0)
            resp.raise_for_status()
            found += doc["doc_id"] in [m["source_ref"]["id"] for m in resp.json()["matches"]]
    out = {"searches": n, "found_new_doc": found, "latency": latency_summary(latencies)}
    logger.info("search right after an ingest: %s", out)
    return out


def write_chunks(store: Any, chunks: list[Any], what: str, flush: bool) -> float:
    progress = Progress(f"write {what}", len(chunks), "chunks", every_s=15.0)
    t0 = time.perf_counter()
    for start in range(0, len(chunks), 256):
        part = chunks[start : start + 256]
        store.upsert(part)
        progress.add(len(part))
    if flush:
        store.flush()
    return time.perf_counter() - t0


async def memory_index_state(client: httpx.AsyncClient) -> dict[str, Any]:
    body = (await client.get("/readyz")).json()
    return body.get("components", {}).get("milvus", {}).get("memory_index", {})


async def warm(
    client: httpx.AsyncClient, args: argparse.Namespace, queries: list[str], chunks: int
) -> float:
    """Search until the Retriever answers from memory with all ``chunks`` (or the index is
    off); returns the seconds it took."""
    t0 = time.perf_counter()
    for i in range(10_000):
        resp = await client.post("/rag/search_docs", json=body(args, queries[i % len(queries)]))
        resp.raise_for_status()
        state = await memory_index_state(client)
        if not state.get("enabled") or (state.get("chunks") == chunks and not state["loading"]):
            if i >= args.warmup:
                break
        else:
            await asyncio.sleep(0.2)
    return time.perf_counter() - t0


def body(args: argparse.Namespace, query: str) -> dict[str, Any]:
    return {"team_id": args.team, "query": query, "top_k": args.top_k}


def parse_server_timing(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        if rest.startswith("dur="):
            out[name] = float(rest[4:])
    return out


async def level(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    qids: list[str],
    queries: dict[str, str],
    concurrency: int,
) -> dict[str, Any]:
    took: list[float] = []
    stages: dict[str, list[float]] = {}
    runs: dict[str, list[str]] = {}

    async def call(qid: str) -> None:
        resp = await client.post("/rag/search_docs", json=body(args, queries[qid]))
        if resp.status_code != 200:
            raise RuntimeError(f"search answered {resp.status_code}: {resp.text[:300]}")
        data = resp.json()
        took.append(float(data["took_ms"]))
        runs[qid] = distinct([m["source_ref"]["id"] for m in data["matches"]])
        for name, ms in parse_server_timing(resp.headers.get("server-timing", "")).items():
            stages.setdefault(name, []).append(ms)

    wall, latencies, _, errors = await closed_loop(qids, concurrency, call)
    for exc in errors[:3]:
        logger.error("search failed: %s", exc)
    return {
        "concurrency": concurrency,
        "requests": len(qids),
        "errors": len(errors),
        "requests_per_s": round(len(latencies) / wall, 2),
        "latency": latency_summary(latencies),
        "server_took_p50_ms": round(statistics.median(took), 2) if took else None,
        "stages_p50_ms": {k: round(statistics.median(v), 2) for k, v in stages.items()},
        "runs": runs,
    }


async def measure(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    labeled: Any,
    requests: list[int],
    label: str,
) -> list[dict[str, Any]]:
    qids = sorted(labeled.queries)
    out = []
    for concurrency, n in zip(args.concurrency, requests, strict=True):
        reps = []
        for rep in range(args.reps):
            res = await level(client, args, qids[:n], labeled.queries, concurrency)
            lat = res["latency"]
            logger.info(
                "%s c=%d rep %d: p50 %s ms, p95 %s ms, %.1f req/s, server p50 %s ms, %d errors",
                label,
                concurrency,
                rep + 1,
                lat.get("p50_ms"),
                lat.get("p95_ms"),
                res["requests_per_s"],
                res["server_took_p50_ms"],
                res["errors"],
            )
            reps.append(res)
        first = {q: reps[0]["runs"][q] for q in qids[: args.ndcg_queries] if q in reps[0]["runs"]}
        ndcg = evaluate(first, labeled.qrels)["ndcg@10"]
        for r in reps:
            r.pop("runs")
        out.append(
            {
                "label": label,
                "concurrency": concurrency,
                "requests": n,
                "p50_ms": statistics.median(r["latency"]["p50_ms"] for r in reps),
                "p95_ms": statistics.median(r["latency"]["p95_ms"] for r in reps),
                "requests_per_s": statistics.median(r["requests_per_s"] for r in reps),
                "server_took_p50_ms": statistics.median(r["server_took_p50_ms"] for r in reps),
                "stages_p50_ms": reps[len(reps) // 2]["stages_p50_ms"],
                "errors": sum(r["errors"] for r in reps),
                "ndcg@10": round(ndcg, 4),
                "reps": reps,
            }
        )
    return out


class Floor:
    """The hardware floor, built once: the query model the gateway uses, an exact numpy dense
    top-k over the chunks' vectors and a ``bm25s`` index of their texts, in this process."""

    def __init__(self, settings: Any, chunks: list[Any], limit: int) -> None:
        import bm25s

        from deployments.models.embedding import EmbedderCore

        self.core = EmbedderCore(settings.embedder)
        self.core.start()
        matrix = np.asarray([c.vector for c in chunks], dtype=np.float32)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        self.matrix, self.limit = matrix, limit
        self.bm25s = bm25s
        self.retriever = bm25s.BM25()
        self.retriever.index(
            bm25s.tokenize([c.text for c in chunks], stopwords=None, show_progress=False),
            show_progress=False,
        )

    def sample(self, queries: list[str], n: int) -> dict[str, list[float]]:
        """One query embedding + dense top-k + BM25 top-k for each of the first ``n``
        queries (after 5 more as a warm-up): each stage's milliseconds, per query."""
        parts: dict[str, list[float]] = {"embed": [], "dense": [], "bm25": [], "total": []}
        for i, query in enumerate(queries[: n + 5]):
            t0 = time.perf_counter()
            vec = self.core.embed([query], "query")[0]
            t1 = time.perf_counter()
            scores = self.matrix @ vec
            top = np.argpartition(-scores, self.limit)[: self.limit]
            top[np.argsort(-scores[top])]
            t2 = time.perf_counter()
            tokens = self.bm25s.tokenize([query], stopwords=None, show_progress=False)
            self.retriever.retrieve(tokens, k=self.limit, show_progress=False, n_threads=1)
            t3 = time.perf_counter()
            if i >= 5:  # warm-up
                for name, dt in (("embed", t1 - t0), ("dense", t2 - t1), ("bm25", t3 - t2)):
                    parts[name].append(dt * 1000)
                parts["total"].append((t3 - t0) * 1000)
        return parts


def floor_samples(
    settings: Any, chunks: list[Any], queries: list[str], limit: int, n: int
) -> dict[str, list[float]]:
    """One in-process query embedding + exact numpy dense top-k + bm25s top-k, per query:
    each stage's milliseconds, per query."""
    return Floor(settings, chunks, limit).sample(queries, n)


def floor_summary(*passes: dict[str, list[float]]) -> dict[str, Any]:
    """Medians over the passes' queries pooled, and each pass's own total: the floor is
    measured before and after the gateway's phase, so a machine that changes speed during
    the run moves both alike."""
    pooled = {k: [x for p in passes for x in p[k]] for k in passes[0]}
    out: dict[str, Any] = {k: round(statistics.median(v), 3) for k, v in pooled.items()}
    out["passes_total"] = [round(statistics.median(p["total"]), 3) for p in passes]
    return out


async def hops(h: ServeHarness, args: argparse.Namespace, labeled: Any, n: int = 200) -> dict:
    """What one hop costs here: ``GET /healthz`` (HTTP proxy → ingress, a route doing nothing)
    and, from this process through handles, a method doing nothing (``Embedder.status``),
    one query embedding, and a Retriever search answered from memory."""
    from ray import serve

    from deployments.protocols import SearchFilter

    settings = h.settings
    queries = [labeled.queries[q] for q in sorted(labeled.queries)][:n]
    vectors = realtext.embed_texts(queries, settings, kind="query", name="appstream-queries")
    embedder = serve.get_deployment_handle("Embedder", app_name="rag").options(_by_reference=False)
    retriever = serve.get_deployment_handle("Retriever", app_name="rag").options(
        _by_reference=False
    )
    flt = SearchFilter(team_id=args.team)
    limit = args.top_k * settings.search.candidate_multiplier
    out: dict[str, Any] = {}

    async def timed(name: str, call: Any) -> None:
        times = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            await call(i % n)
            if i >= 20:
                times.append(time.perf_counter() - t0)
        out[name] = latency_summary(times)
        logger.info("hop %s: p50 %s ms", name, out[name]["p50_ms"])

    async with httpx.AsyncClient(base_url=h.base_url, timeout=30.0) as client:
        await timed("http_healthz", lambda i: client.get("/healthz"))
    await timed("handle_embedder_status", lambda i: embedder.status.remote())
    await timed("handle_embed_query", lambda i: embedder.embed.remote([queries[i]], "query"))
    await timed(
        "handle_retriever_memory",
        lambda i: retriever.candidates.remote(
            queries[i], vectors[i].tolist(), flt, limit, ("dense", "bm25")
        ),
    )
    return out


async def phase(
    h: ServeHarness,
    args: argparse.Namespace,
    labeled: Any,
    chunks: list[Any],
    label: str,
    headers: dict[str, str],
    requests: list[int],
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=max(args.concurrency) + 2)
    queries = [labeled.queries[q] for q in sorted(labeled.queries)]
    async with httpx.AsyncClient(
        base_url=h.base_url, timeout=120.0, limits=limits, headers=headers
    ) as client:
        warm_s = await warm(client, args, queries, len(chunks))
        logger.info("%s: warm after %.1fs: %s", label, warm_s, await memory_index_state(client))
        levels = await measure(client, args, labeled, requests, label)
        # The replicas' own timings (Embedder batches, memory-index sync and search).
        components = (await client.get("/readyz")).json().get("components", {})
    logger.info(
        "%s: embedder %s; memory index %s",
        label,
        components.get("embedder", {}).get("timing"),
        components.get("milvus", {}).get("memory_index", {}).get("timing"),
    )
    return {
        "label": label,
        "chunks": len(chunks),
        "warm_s": round(warm_s, 1),
        "levels": levels,
        "components": components,
    }


async def run(args: argparse.Namespace, h: ServeHarness) -> dict[str, Any]:
    settings = h.settings
    labeled = realtext.appstream(args.team)
    chunks = realtext.embed_chunks(
        realtext.build_chunks(labeled.documents, settings), settings, name="appstream"
    )
    chunks = realtext.with_acls(chunks, args.acl_share)
    result_acl = sum(1 for c in chunks if c.acl_deny)
    logger.info("chunks with a document ACL: %d of %d", result_acl, len(chunks))
    queries = [labeled.queries[q] for q in sorted(labeled.queries)]
    headers = (
        {"authorization": f"Bearer {token(args.team, settings)}"} if args.auth == "jwt" else {}
    )
    store = h.milvus_store()
    store.start()
    result: dict[str, Any] = {"phases": [], "floors": [], "acl_chunks": result_acl}
    result["write_s"] = round(write_chunks(store, chunks, "AppStream", args.flush), 1)
    limit = args.top_k * settings.search.candidate_multiplier
    before = floor_samples(settings, chunks, queries, limit, args.floor_queries)
    result["phases"].append(await phase(h, args, labeled, chunks, "base", headers, args.requests))
    after = floor_samples(settings, chunks, queries, limit, args.floor_queries)
    result["floors"].append({"chunks": len(chunks), **floor_summary(before, after)})
    logger.info("floor at %d chunks: %s", len(chunks), result["floors"][-1])
    if args.grow > 1:
        extra = (args.grow - 1) * len(chunks)
        kjv = realtext.embed_chunks(
            realtext.build_chunks(realtext.kjv_documents(args.team, extra), settings),
            settings,
            name="kjv",
        )
        result["grow_write_s"] = round(write_chunks(store, kjv, "KJV", args.flush), 1)
        grown = chunks + kjv
        before = floor_samples(settings, grown, queries, limit, args.floor_queries)
        result["phases"].append(
            await phase(h, args, labeled, grown, f"{args.grow}x", headers, args.requests)
        )
        after = floor_samples(settings, grown, queries, limit, args.floor_queries)
        result["floors"].append({"chunks": len(grown), **floor_summary(before, after)})
        logger.info("floor at %d chunks: %s", len(grown), result["floors"][-1])
        chunks = grown
    store.close()
    result["hops"] = await hops(h, args, labeled)
    if args.after_ingest:
        result["after_ingest"] = await after_ingest(h, args, args.after_ingest)
    if args.compare_off:
        h.redeploy({"milvus": {"memory_index": {"enabled": False}}})
        result["phases"].append(
            await phase(h, args, labeled, chunks, "memory index off", headers, args.off_requests)
        )
    return result


def render(result: dict[str, Any]) -> str:
    floors = {f["chunks"]: f for f in result["floors"]}
    rows = []
    for f in result["floors"]:
        rows.append(
            [
                f"floor: embed {f['embed']} + numpy {f['dense']} + bm25s {f['bm25']} ms",
                f["chunks"],
                1,
                f["total"],
                "–",
                "–",
                "1.00×",
                "–",
            ]
        )
    for ph in result["phases"]:
        fl = floors.get(ph["chunks"])
        for lv in ph["levels"]:
            ratio = f"{lv['p50_ms'] / fl['total']:.2f}×" if fl else "–"
            rows.append(
                [
                    f"gateway ({ph['label']})",
                    ph["chunks"],
                    lv["concurrency"],
                    lv["p50_ms"],
                    lv["p95_ms"],
                    lv["requests_per_s"],
                    ratio,
                    lv["ndcg@10"],
                ]
            )
    table = markdown_table(
        ["path", "chunks", "concurrency", "p50 ms", "p95 ms", "req/s", "p50 vs floor", "nDCG@10*"],
        rows,
    )
    stages = []
    for ph in result["phases"]:
        for lv in ph["levels"]:
            st = lv["stages_p50_ms"]
            stages.append(
                [ph["label"], lv["concurrency"], lv["server_took_p50_ms"]]
                + [", ".join(f"{k} {v}" for k, v in st.items())]
            )
    return (
        table
        + "\n\n"
        + markdown_table(["phase", "concurrency", "server took p50 ms", "stages p50 ms"], stages)
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    for item in args.serve_env:
        name, _, value = item.partition("=")
        os.environ[name] = value
    settings: dict[str, Any] = {}
    if args.auth == "jwt":
        settings["auth"] = {"mode": "jwt", "hs256_secret": SECRET}
    harness = ServeHarness(port=args.port, collection=args.collection, settings=settings)
    result: dict[str, Any] = {
        "benchmark": "search_real",
        "args": vars(args),
        "environment": environment_info(),
        "search_settings": harness.settings.search.model_dump(),
        "query_embedding": {
            "location": harness.settings.embedder.query_location,
            "in_ingress": harness.settings.embedder.queries_in_ingress,
            "ingress_query_slots": harness.settings.embedder.ingress_query_slots,
        },
    }
    run_benchmark("search_real", harness, result, lambda h: run(args, h), render, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
