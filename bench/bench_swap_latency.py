"""Search latency around a reindex swap (issue 33): is the new version in memory before the
searches reach it?

    .venv/bin/python -m bench.bench_swap_latency --reps 3            # announce (issue 33)
    .venv/bin/python -m bench.bench_swap_latency --reps 3 --no-announce  # as before it

One team of real text (``bench.realtext``: the AppStream descriptions, ~2,365 chunks, real
MiniLM embeddings; queries: the components' summaries, embedded as queries) is written into
Milvus (the Milvus Lite server of ``scripts/services.py``) by one ``MilvusStore`` (the
"job"), and searched by a ``RetrieverDeployment`` core in this process (its in-memory index
on, loaded before measuring): ``candidates(dense + bm25, 40)`` per search, a new read id
each, ``--concurrency`` searches in flight, all the time. Per repetition, on a fresh base
collection:

1. idle: after ``--settle-s`` (the initial write falls out of the change log's lookback),
   ``--idle-s`` seconds of searches (the reference p50);
2. the reindex: ``__v2`` created and filled with the same chunks re-tagged (``embed_model``
   ``…+v2``, so every hit says which version it came from), flushed; with announce,
   ``CollectionVersions.announce`` and the wait until the Retriever holds the staged copy
   (its load time is reported); then a catch-up into ``__v2`` (``--catchup`` chunks
   rewritten, a tenth of that deleted), the switch, and ``--window-s`` seconds more.

Reported per mode, medians over repetitions: idle p50; in the window after the switch
returned, p50, max, p50 ÷ idle p50 and how many searches went to Milvus; and over all
searches after the switch, ``mixed`` (hits of both versions in one answer) and ``stale``
(started after the switch returned, answered from the old version).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import statistics
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from bench import realtext
from bench.common import environment_info, markdown_table, setup_logging, write_result
from deployments.protocols import ChunkRecord, SearchFilter, SearchHit
from deployments.vector_store.deployment import RetrieverDeployment
from deployments.vector_store.store import MilvusStore
from serve_app.search.ranking import adaptive_weights, fuse_weighted
from serve_app.settings import GatewaySettings, SearchSettings

logger = logging.getLogger("bench.swap_latency")
TEAM = "bench_swap_t0"
LIMIT = 40  # top_k 10 × candidate_multiplier 4, as the ingress fetches


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_swap_latency",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-announce", action="store_true", help="swap without announcing")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--idle-s", type=float, default=3.0)
    p.add_argument(
        "--settle-s",
        type=float,
        default=32.0,
        help="wait after the initial write (past the change log's 30 s lookback, so neither "
        "load replays the whole initial write)",
    )
    p.add_argument("--window-s", type=float, default=2.0)
    p.add_argument("--catchup", type=int, default=50, help="chunks rewritten before the switch")
    p.add_argument(
        "--compare-milvus",
        action="store_true",
        help="first: how many queries' documents differ between Milvus and the memory index "
        "(one version, settled): what a search that falls back to Milvus returns",
    )
    p.add_argument("--label", default="", help="a name for this run in the result file")
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


@dataclass(frozen=True)
class Search:
    started: float
    took: float
    query: int
    tags: frozenset[str]  # the embed_model of its hits: which version(s) it read
    memory: bool  # answered from the in-memory index
    top10: tuple[str, ...]  # the documents it returns (fused as the ingress fuses)


def fused_top10(found: dict[str, list[SearchHit]]) -> tuple[str, ...]:
    """The top 10 documents of the app's default hybrid fusion (adaptive weighted)."""
    cfg = SearchSettings()
    weights = adaptive_weights(
        found,
        {"dense": cfg.dense_weight, "bm25": cfg.bm25_weight},
        cfg.adaptive_gamma,
        cfg.adaptive_k,
        cfg.adaptive_measure,
    )
    return tuple(h.chunk.doc_id for h in fuse_weighted(found, weights, cfg.fusion_normalisation))[
        :10
    ]


class Searches:
    """``concurrency`` closed loops of searches, each recorded as a ``Search``."""

    def __init__(self, retriever: RetrieverDeployment, queries: list[tuple[str, list[float]]]):
        self.retriever = retriever
        self.queries = queries
        self.records: list[Search] = []
        self.stop = asyncio.Event()

    async def one(self, i: int) -> dict[str, list[SearchHit]]:
        text, vector = self.queries[i]
        return await self.retriever.candidates(
            text, vector, SearchFilter(team_id=TEAM), LIMIT, ("dense", "bm25"), uuid.uuid4().hex
        )

    async def answers(self) -> list[tuple[str, ...]]:
        """Every query's documents now (the reference answers of the version in memory)."""
        return [fused_top10(await self.one(i)) for i in range(len(self.queries))]

    async def loop(self, offset: int, step: int) -> None:
        hot = self.retriever.hot
        i = offset
        while not self.stop.is_set():
            q = i % len(self.queries)
            i += step
            hits_before = hot.stats["hits"] if hot is not None else 0
            started = time.perf_counter()
            found = await self.one(q)
            took = time.perf_counter() - started
            tags = frozenset(h.chunk.embed_model for hits in found.values() for h in hits)
            memory = hot is not None and hot.stats["hits"] > hits_before
            self.records.append(Search(started, took, q, tags, memory, fused_top10(found)))


async def compare_milvus(
    retriever: RetrieverDeployment,
    queries: list[tuple[str, list[float]]],
    memory: list[tuple[str, ...]],
) -> int:
    """How many queries' top 10 documents differ (as a set) when dense and BM25 come from
    Milvus (``MilvusStore.search``, as a search that falls back does) instead of memory."""
    flt = SearchFilter(team_id=TEAM)
    differs = 0
    for i, (text, vector) in enumerate(queries):
        found = {
            m: await asyncio.to_thread(retriever.store.search, text, vector, flt, LIMIT, m)
            for m in ("dense", "bm25")
        }
        differs += set(fused_top10(found)) != set(memory[i])
    logger.info("Milvus vs memory: %d of %d queries return other documents", differs, len(queries))
    return differs


def reindex(
    writer: MilvusStore,
    retriever: RetrieverDeployment,
    chunks: list[ChunkRecord],
    args: argparse.Namespace,
    marks: dict[str, float],
) -> None:
    """The job: build v2, (announce, wait for the staged copy), catch up, switch."""
    time.sleep(args.idle_s)
    marks["build"] = time.perf_counter()
    versions = writer.versions
    physical = versions.create(TEAM, 2)
    rebuilt = [replace(c, embed_model=c.embed_model + "+v2") for c in chunks]
    for start in range(0, len(rebuilt), 500):
        versions.upsert(physical, rebuilt[start : start + 500])
    versions.flush(physical)
    marks["built"] = time.perf_counter()
    if not args.no_announce:
        versions.announce(TEAM, 2)
        marks["announced"] = time.perf_counter()
        assert retriever.hot is not None
        if not retriever.hot.staging.wait(TEAM, physical, timeout_s=600):
            raise RuntimeError("the staged copy was not ready within 600 s")
        marks["staged"] = time.perf_counter()
    changed = [replace(c, text=c.text + " (edited)") for c in rebuilt[: args.catchup]]
    versions.upsert(physical, changed)
    versions.delete(physical, [c.chunk_id for c in rebuilt[-max(1, args.catchup // 10) :]])
    marks["switch"] = time.perf_counter()
    versions.switch(TEAM, 2)
    marks["switched"] = time.perf_counter()
    time.sleep(args.window_s + 0.5)


async def one_rep(
    settings: GatewaySettings,
    chunks: list[ChunkRecord],
    queries: list[tuple[str, list[float]]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    milvus = settings.milvus.model_copy(update={"collection": f"bench_swap_{secrets.token_hex(4)}"})
    dim = len(chunks[0].vector)
    writer = MilvusStore(milvus, dim=dim)
    writer.start()
    retriever = RetrieverDeployment(milvus, dim)
    try:
        for start in range(0, len(chunks), 500):
            writer.upsert(chunks[start : start + 500])
        writer.flush(TEAM)
        assert retriever.hot is not None, "the memory index is off"
        t0 = time.perf_counter()
        if not retriever.hot.wait_loaded(TEAM, timeout_s=600):
            raise RuntimeError("the team was not loaded within 600 s")
        logger.info("team loaded in %.1f s", time.perf_counter() - t0)
        await asyncio.sleep(max(0.0, args.settle_s - (time.perf_counter() - t0)))
        searches = Searches(retriever, queries)
        before = await searches.answers()  # v1's answers, from memory
        differs = await compare_milvus(retriever, queries, before) if args.compare_milvus else None
        loops = [
            asyncio.create_task(searches.loop(k, args.concurrency)) for k in range(args.concurrency)
        ]
        marks: dict[str, float] = {"start": time.perf_counter()}
        try:
            await asyncio.to_thread(reindex, writer, retriever, chunks, args, marks)
        finally:
            searches.stop.set()
            await asyncio.gather(*loops)
        if not retriever.hot.wait_loaded(TEAM, timeout_s=600):
            raise RuntimeError("the team was not loaded again within 600 s")
        after = await searches.answers()  # v2's answers, from memory
        result = summarise(searches.records, marks, args.window_s, (before, after))
        return result if differs is None else {**result, "milvus_differs": differs}
    finally:
        if retriever.hot is not None:
            retriever.hot.close()
        retriever.store.close()
        writer.drop()
        writer.close()


def summarise(
    records: list[Search],
    marks: dict[str, float],
    window_s: float,
    answers: tuple[list[tuple[str, ...]], list[tuple[str, ...]]],
) -> dict[str, Any]:
    def ms(values: list[float], how: str) -> float:
        if not values:
            return float("nan")
        return round(1000 * (statistics.median(values) if how == "p50" else max(values)), 1)

    def between(start: float, end: float) -> list[Search]:
        return [r for r in records if start <= r.started < end]

    switched = marks["switched"]
    idle = [r.took for r in between(marks["start"] + 0.5, marks["build"])]
    building = [r.took for r in between(marks["build"], marks["switch"])]
    staging = [r.took for r in between(marks.get("announced", 1e18), marks.get("staged", 0))]
    # The searches in flight while ``switch`` ran (started before it returned).
    spanning = [r.took for r in between(marks["switch"] - 0.5, switched)]
    window = between(switched, switched + window_s)
    after = between(marks["switch"], 1e18)
    old = {t for r in records if r.started < marks["build"] for t in r.tags}
    before_v, after_v = answers
    out = {
        "idle_p50_ms": ms(idle, "p50"),
        "build_p50_ms": ms(building, "p50"),
        "build_max_ms": ms(building, "max"),
        "staging_max_ms": ms(staging, "max"),
        "window_p50_ms": ms([r.took for r in window], "p50"),
        "window_max_ms": ms([r.took for r in window], "max"),
        "spanning_max_ms": ms(spanning, "max"),
        "window_searches": len(window),
        "window_in_milvus": sum(1 for r in window if not r.memory),
        # Hits of both versions in one answer; answered from the old one after the switch.
        "mixed": sum(1 for r in after if len({t in old for t in r.tags}) > 1),
        "stale": sum(1 for r in after if r.started >= switched and r.tags and r.tags <= old),
        # Documents that neither version's answer (from memory, settled) gives.
        "neither": sum(1 for r in after if r.top10 not in (before_v[r.query], after_v[r.query])),
        # The control: before the switch every answer is v1's.
        "neither_before_switch": sum(
            1 for r in records if r.started < marks["switch"] and r.top10 != before_v[r.query]
        ),
        "switch_call_ms": round(1000 * (switched - marks["switch"]), 1),
        "build_s": round(marks["built"] - marks["build"], 2),
    }
    if "staged" in marks:
        out["stage_wait_s"] = round(marks["staged"] - marks["announced"], 2)
    out["window_p50_over_idle"] = round(out["window_p50_ms"] / out["idle_p50_ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    settings = GatewaySettings()
    labeled = realtext.appstream(TEAM)
    chunks = realtext.embed_chunks(
        realtext.build_chunks(labeled.documents, settings), settings, name="appstream"
    )
    texts = [labeled.queries[q] for q in sorted(labeled.queries)][:500]
    vectors = realtext.embed_texts(texts, settings, kind="query", name="appstream-queries")
    queries = [(t, v.tolist()) for t, v in zip(texts, vectors, strict=True)]
    logger.info("%d chunks, %d queries", len(chunks), len(queries))
    reps = []
    for rep in range(args.reps):
        result = asyncio.run(one_rep(settings, chunks, queries, args))
        logger.info("rep %d: %s", rep + 1, result)
        reps.append(result)
    keys = [k for k in reps[0] if all(isinstance(r.get(k), int | float) for r in reps)]
    median = {k: round(statistics.median(r[k] for r in reps), 2) for k in keys}
    mode = "no announce" if args.no_announce else "announce"
    print(
        markdown_table(
            ["mode", *keys],
            [[f"{mode} {args.label}".strip(), *(median[k] for k in keys)]],
        )
    )
    write_result(
        "swap_latency",
        {
            "args": vars(args),
            "chunks": len(chunks),
            "queries": len(queries),
            "reps": reps,
            "median": median,
            "environment": environment_info(),
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
