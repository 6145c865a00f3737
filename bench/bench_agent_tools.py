"""Agent tools (issue 15) in one run: RAG profiles, the semantic cache and the MCP face.

One ``ServeHarness`` run (JWT auth, no graph deployment, a private state database for the
cache's index generations) with a profiles file in the run's temp folder; tokens carry the
agent id, so the gateway picks the profile from the verified agent:

* ``bench_default`` strict, no ``min_score``; ``bench_light`` light (BM25 only, at most 10
  passages); ``bench_strict`` strict with a ``min_score`` chosen on the dev queries;
  ``bench_nocache`` strict — all four with ``cache_ttl_s: 0`` (the cache is bypassed);
  ``bench_cache`` strict with the cache on (``cache.ttl_s``).
* Data: the AppStream descriptions (``bench.quality.appstream_set``, queried by their
  one-line summaries) and the KJV verses of ``--books`` (``bench.quality.bible_set``, queried
  by the WEB wording of the same verse), in two teams, written straight into Milvus with
  cached real embeddings (``bench.realtext``).

Phases:

1. **Profiles**: the test queries of each set through ``POST /rag/search_docs`` with each
   profile's token, the three profiles interleaved per query, concurrency 1: p50/p95, the
   ratio of each p50 to the default profile's, nDCG@10, Recall@10, passages per answer.
   ``bench_strict``'s ``min_score`` is the highest that costs at most ``--min-score-loss``
   nDCG@10 on the dev queries of either set (scored offline from the default profile's dev
   answers: the server drops hits below the floor before it keeps ``top_k``), then the app is
   redeployed with it (``--strict-min-score`` skips the tuning).
2. **Semantic cache**: a seeded query log of ``--requests`` requests — Bible verses with a
   Zipf-like popularity, each worded as the WEB verse, a casing/spacing variant of it (the
   same key after normalisation) or the KJV wording (a real paraphrase), and AppStream
   summaries (as is, or a variant) — replayed with ``bench_cache`` (cosine threshold
   ``cache.similarity`` 0.95; again at ``--second-similarity`` after a redeploy). Hit ratio,
   exact vs near-duplicate hits against what the log made possible, p50/p95 of hits vs
   misses, and every near-duplicate hit's answer scored against a fresh uncached search of
   the same request (``bench_nocache``).
3. **MCP overhead**: ``--mcp-queries`` queries each through ``POST /rag/search_docs``,
   ``POST /tools/rag_search_docs`` and the MCP SDK client's ``call_tool`` (Streamable HTTP at
   ``/mcp``), interleaved per query, ``bench_nocache``'s token; one keep-alive ``httpx2``
   client per path. Skipped, with the reason, when the MCP server does not answer.
4. **Redis** (with ``--redis-url``): the app redeployed with ``cache.backend=redis`` (a
   private key prefix, deleted at the end) and the same log replayed: hit/miss latency with
   Redis vs the in-memory store.

``--near-check`` runs another, shorter mode instead (issue 38, item 7): ``cache.near_check``
``off`` vs ``lexical`` in one run (a redeploy between them empties the in-memory cache). For
each: the log of phase 2 replayed (hit ratio, near hits served and refused, each near hit's
answer against a fresh search), and ``--distinct`` distinct AppStream summaries (dev, then
test queries of the set with every component's summary) asked twice by an agent of their own
(``bench_cache_twice``): nDCG@10 of the second, cached answers against fresh uncached ones.

    .venv/bin/python -m bench.bench_agent_tools \\
        --redis-url "$(.venv/bin/python scripts/services.py url redis)"
    .venv/bin/python -m bench.bench_agent_tools --quick   # smoke run ~3-4 min; full run ~8 min
    .venv/bin/python -m bench.bench_agent_tools --near-check   # near_check off vs lexical
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import random
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import realtext
from bench.bench_search_real import memory_index_state, parse_server_timing, write_chunks
from bench.common import (
    DEFAULT_PORT,
    Progress,
    environment_info,
    latency_summary,
    markdown_table,
    percentile,
    setup_logging,
)
from bench.quality import appstream_set, bible_set
from bench.quality.bible_set import DEFAULT_BOOKS, LabeledSet
from bench.quality.metrics import distinct, evaluate, ndcg_at_k
from bench.serve_harness import ServeHarness, run_benchmark
from serve_app.search.cache.semantic import normalise

logger = logging.getLogger("bench.agent_tools")
SECRET = "bench-agent-tools-hs256-secret-0123456789abcdef"
COLLECTION = "bench_agent_tools"
TOP_K = 10
TOOL = "rag_search_docs"
# The agents of the profiles file; the phase-1 rows in their table order.
PROFILE_AGENTS = {"default": "bench_default", "light": "bench_light", "strict": "bench_strict"}
NOCACHE, CACHE = "bench_nocache", "bench_cache"
# The cache agent of --near-check's distinct queries asked twice (a bucket of its own).
CACHE_TWICE = "bench_cache_twice"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_agent_tools",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    p.add_argument("--books", default=",".join(DEFAULT_BOOKS), help="Bible books, comma list")
    p.add_argument("--profile-queries", type=int, default=200, help="test queries per set")
    p.add_argument("--dev-queries", type=int, default=100, help="dev queries per set (tuning)")
    p.add_argument("--requests", type=int, default=600, help="requests in the cache log")
    p.add_argument("--refs", type=int, default=250, help="distinct verses in the cache log")
    p.add_argument("--apps", type=int, default=100, help="distinct summaries in the cache log")
    p.add_argument("--app-share", type=float, default=0.25, help="AppStream part of the log")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent")
    p.add_argument(
        "--wording",
        default="0.6,0.15,0.25",
        help="shares of a verse request worded as WEB, a casing/spacing variant, the KJV",
    )
    p.add_argument("--seed", type=int, default=15)
    p.add_argument(
        "--second-similarity",
        type=float,
        default=0.90,
        help="replay the log again at this cache.similarity (0: skip)",
    )
    p.add_argument("--strict-min-score", type=float, default=None, help="skip the tuning")
    p.add_argument(
        "--min-score-loss",
        type=float,
        default=0.01,
        help="the most dev nDCG@10 bench_strict's min_score may cost on either set",
    )
    p.add_argument("--mcp-queries", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20, help="searches per team before timing")
    p.add_argument("--redis-url", default="", help="also measure cache.backend=redis")
    p.add_argument(
        "--near-check",
        action="store_true",
        help="only compare cache.near_check off vs lexical (issue 38, item 7)",
    )
    p.add_argument(
        "--distinct", type=int, default=400, help="--near-check: distinct summaries asked twice"
    )
    p.add_argument(
        "--near-similarities",
        default="0.95,0.9",
        help="--near-check: the cache.similarity values, each with near_check off and lexical",
    )
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


QUICK = {
    "profile_queries": 15,
    "dev_queries": 30,
    "requests": 80,
    "refs": 25,
    "apps": 10,
    "mcp_queries": 10,
    "warmup": 8,
    "distinct": 60,
}


# --- data ---------------------------------------------------------------------------------


@dataclass
class DataSet:
    key: str  # "apps" | "bible"
    team: str
    labeled: LabeledSet
    chunks: int = 0


def load_sets(args: argparse.Namespace, extra_test: bool = False) -> list[DataSet]:
    books = tuple(b for b in args.books.split(",") if b)
    apps = appstream_set.build(team_id="bench_agent_apps", extra_test=extra_test)
    bible = bible_set.build("paraphrase", books, team_id="bench_agent_bible")
    return [DataSet("apps", "bench_agent_apps", apps), DataSet("bible", "bench_agent_bible", bible)]


def write_sets(h: ServeHarness, sets: list[DataSet]) -> dict[str, Any]:
    """Every set's chunks, embedded in this process (cached on disk), into Milvus."""
    store = h.milvus_store()
    store.start()
    out = {}
    try:
        for ds in sets:
            chunks = realtext.embed_chunks(
                realtext.build_chunks(ds.labeled.documents, h.settings),
                h.settings,
                name="appstream" if ds.key == "apps" else "agent-bible",
            )
            ds.chunks = len(chunks)
            out[ds.key] = {
                "documents": len(ds.labeled.documents),
                "chunks": len(chunks),
                "write_s": round(write_chunks(store, chunks, ds.key, flush=True), 1),
            }
    finally:
        store.close()
    return out


def profiles_yaml(strict_min_score: float | None) -> dict[str, Any]:
    strict: dict[str, Any] = {"rag_mode": "strict", "max_docs_per_query": 50, "cache_ttl_s": 0}
    agents: dict[str, Any] = {
        "bench_default": dict(strict),
        "bench_light": {"rag_mode": "light", "max_docs_per_query": 10, "cache_ttl_s": 0},
        NOCACHE: dict(strict),
        # cache_ttl_s unset: the cache's own ttl_s.
        CACHE: {"rag_mode": "strict", "max_docs_per_query": 50},
        CACHE_TWICE: {"rag_mode": "strict", "max_docs_per_query": 50},
    }
    if strict_min_score is not None:
        agents["bench_strict"] = {**strict, "min_score": strict_min_score}
    return {"default": dict(strict), "agents": agents}


def write_profiles(folder: Path, name: str, strict_min_score: float | None) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(profiles_yaml(strict_min_score), sort_keys=False))
    return path


# --- the gateway --------------------------------------------------------------------------


def agent_token(settings: Any, agent: str, team: str) -> str:
    import jwt

    now = int(time.time())
    names = settings.auth.claims
    claims = {
        "sub": f"bench-{agent}",
        "iat": now,
        "exp": now + 86_400,
        names.agent_id: agent,
        names.teams: {team: ["member"]},
    }
    return jwt.encode(claims, SECRET, "HS256")


class Tokens:
    """Bearer headers per (agent, team)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._made: dict[tuple[str, str], dict[str, str]] = {}

    def __call__(self, agent: str, team: str) -> dict[str, str]:
        if (agent, team) not in self._made:
            token = agent_token(self.settings, agent, team)
            self._made[(agent, team)] = {"authorization": f"Bearer {token}"}
        return self._made[(agent, team)]


@dataclass
class Answer:
    seconds: float
    docs: list[str]  # distinct doc ids, ranked
    scored: list[tuple[str, float]]  # (doc id, fused score) per match, ranked
    cache: dict[str, Any]
    profile: dict[str, Any]
    stages: dict[str, float]
    matches: int

    @property
    def hit(self) -> bool:
        return bool(self.cache.get("hit"))

    @property
    def similarity(self) -> float | None:
        return self.cache.get("similarity")


def answer_of(seconds: float, resp: Any, body: dict[str, Any]) -> Answer:
    matches = body.get("matches", [])
    scored = [(m["source_ref"]["id"], float(m["score"])) for m in matches]
    return Answer(
        seconds=seconds,
        docs=distinct([d for d, _ in scored]),
        scored=scored,
        cache=body.get("cache") or {},
        profile=body.get("profile") or {},
        stages=parse_server_timing(resp.headers.get("server-timing", "")),
        matches=len(matches),
    )


async def search(
    client: httpx.AsyncClient, headers: dict[str, str], team: str, query: str, top_k: int = TOP_K
) -> Answer:
    t0 = time.perf_counter()
    resp = await client.post(
        "/rag/search_docs",
        json={"team_id": team, "query": query, "top_k": top_k},
        headers=headers,
    )
    seconds = time.perf_counter() - t0
    if resp.status_code != 200:
        raise RuntimeError(f"search answered {resp.status_code}: {resp.text[:300]}")
    return answer_of(seconds, resp, resp.json())


async def warm(
    h: ServeHarness,
    client: httpx.AsyncClient,
    tokens: Tokens,
    sets: list[DataSet],
    n: int,
) -> dict[str, Any]:
    """Search every team (default, light and — with another request shape, so in a bucket of
    its own — the cache agent) until the Retriever answers from memory with every chunk and
    at least ``n`` searches per team ran; the cache agent's warm-up entries can never answer
    a later request of the log (their bucket differs by ``top_k``)."""
    t0 = time.perf_counter()
    total = sum(ds.chunks for ds in sets)
    queries = {ds.key: [ds.labeled.queries[q] for q in ds.labeled.dev] for ds in sets}
    state: dict[str, Any] = {}
    for i in range(10_000):
        for ds in sets:
            text = queries[ds.key][i % len(queries[ds.key])]
            agent = (PROFILE_AGENTS["default"], PROFILE_AGENTS["light"], CACHE)[i % 3]
            await search(client, tokens(agent, ds.team), ds.team, text, TOP_K - 1)
        state = await memory_index_state(client)
        ready = not state.get("enabled") or (
            state.get("chunks") == total and not state.get("loading")
        )
        if ready and i + 1 >= n:
            break
        if not ready:
            await asyncio.sleep(0.2)
        if time.perf_counter() - t0 > h.ready_timeout_s:
            raise TimeoutError(f"memory index not loaded after {h.ready_timeout_s:.0f}s: {state}")
    took = round(time.perf_counter() - t0, 1)
    logger.info("warm after %.1fs: memory index %s", took, state)
    return {"s": took, "memory_index": {k: v for k, v in state.items() if k != "timing"}}


async def readyz_components(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/readyz")).json().get("components", {})


# --- phase 1: profiles ---------------------------------------------------------------------


def kept_docs(scored: list[tuple[str, float]], floor: float) -> list[str]:
    """The ranked doc ids an answer would keep with ``min_score`` ``floor``."""
    return distinct([d for d, s in scored if s >= floor])


async def tune_min_score(
    client: httpx.AsyncClient, tokens: Tokens, sets: list[DataSet], n_dev: int, max_loss: float
) -> dict[str, Any]:
    """The highest ``min_score`` (a grid of 0.01) whose dev nDCG@10 is at most ``max_loss``
    below no floor on every set, from the default profile's dev answers."""
    answers: dict[str, dict[str, list[tuple[str, float]]]] = {}
    progress = Progress("dev queries (min_score tuning)", n_dev * len(sets), "queries", 15.0)
    for ds in sets:
        answers[ds.key] = {}
        for qid in ds.labeled.dev[:n_dev]:
            found = await search(
                client,
                tokens(PROFILE_AGENTS["default"], ds.team),
                ds.team,
                ds.labeled.queries[qid],
            )
            answers[ds.key][qid] = found.scored
            progress.add(1)
    qrels = {ds.key: ds.labeled.qrels for ds in sets}
    top = max((s for a in answers.values() for r in a.values() for _, s in r), default=0.0)
    grid = [round(0.01 * i, 2) for i in range(int(min(top, 1.0) * 100) + 1)]
    curve = []
    for floor in grid:
        row: dict[str, Any] = {"min_score": floor}
        for key, runs in answers.items():
            kept = {q: kept_docs(r, floor) for q, r in runs.items()}
            row[key] = {
                "ndcg@10": round(evaluate(kept, qrels[key])["ndcg@10"], 4),
                "passages": round(statistics.fmean(len(v) for v in kept.values()), 2),
            }
        curve.append(row)
    base = curve[0]
    chosen = 0.0
    for row in curve:
        if all(base[k]["ndcg@10"] - row[k]["ndcg@10"] <= max_loss + 1e-9 for k in answers):
            chosen = row["min_score"]
    logger.info(
        "min_score %.2f chosen on dev (max loss %.3f): %s",
        chosen,
        max_loss,
        next(r for r in curve if r["min_score"] == chosen),
    )
    # Every row up to the choice and a few after: the trade-off around it.
    shown = [
        r
        for r in curve
        if r["min_score"] <= chosen + 0.1
        and (round(r["min_score"] * 100) % 5 == 0 or r["min_score"] == chosen)
    ]
    # The fused scores are normalised per query: the best hit's score says how a hit compares
    # with the best one, not how relevant the best one is.
    top1 = [r[0][1] for a in answers.values() for r in a.values() if r]
    return {
        "chosen": chosen,
        "max_loss": max_loss,
        "top_score": top,
        "top1_score": {"min": min(top1, default=math.nan), "median": statistics.median(top1)},
        "curve": shown,
    }


async def profiles_phase(
    client: httpx.AsyncClient, tokens: Tokens, sets: list[DataSet], n: int
) -> dict[str, Any]:
    """Every test query with every profile's token, the profiles interleaved per query in a
    rotating order, concurrency 1."""
    names = list(PROFILE_AGENTS)
    rows: list[dict[str, Any]] = []
    anomalies: list[str] = []
    for ds in sets:
        qids = ds.labeled.test[:n]
        got: dict[str, dict[str, Answer]] = {p: {} for p in names}
        progress = Progress(f"profiles on {ds.key}", len(qids) * len(names), "searches", 15.0)
        for i, qid in enumerate(qids):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                agent = PROFILE_AGENTS[name]
                found = await search(
                    client, tokens(agent, ds.team), ds.team, ds.labeled.queries[qid]
                )
                got[name][qid] = found
                if found.profile.get("name") != agent:
                    anomalies.append(f"{agent} ran under profile {found.profile}")
                if found.cache.get("status") not in (None, "bypass"):
                    anomalies.append(f"{agent} cache status {found.cache}")
                progress.add(1)
        for name in names:
            answers = got[name]
            scores = evaluate({q: a.docs for q, a in answers.items()}, ds.labeled.qrels)
            stages: dict[str, list[float]] = {}
            for a in answers.values():
                for stage, ms in a.stages.items():
                    stages.setdefault(stage, []).append(ms)
            first = next(iter(answers.values()))
            rows.append(
                {
                    "set": ds.key,
                    "set_name": ds.labeled.name,
                    "profile": name,
                    "agent": PROFILE_AGENTS[name],
                    "rag_mode": first.profile.get("rag_mode"),
                    "latency": latency_summary([a.seconds for a in answers.values()]),
                    "ndcg@10": round(scores["ndcg@10"], 4),
                    "recall@10": round(scores["recall@10"], 4),
                    "mrr@10": round(scores["mrr@10"], 4),
                    "passages": round(statistics.fmean(a.matches for a in answers.values()), 2),
                    "stages_p50_ms": {k: round(statistics.median(v), 2) for k, v in stages.items()},
                }
            )
        base = next(r for r in rows if r["set"] == ds.key and r["profile"] == "default")
        for r in rows:
            if r["set"] == ds.key:
                r["p50_vs_default"] = round(r["latency"]["p50_ms"] / base["latency"]["p50_ms"], 3)
                logger.info(
                    "%s %s: p50 %.1f ms (%.2f×), nDCG@10 %.4f, %.1f passages",
                    ds.key,
                    r["profile"],
                    r["latency"]["p50_ms"],
                    r["p50_vs_default"],
                    r["ndcg@10"],
                    r["passages"],
                )
    return {"rows": rows, "anomalies": sorted(set(anomalies))[:20]}


# --- phase 2: the semantic cache -----------------------------------------------------------


@dataclass
class LogRequest:
    set_key: str
    team: str
    qid: str  # the label: the verse or the component asked for
    kind: str  # web | variant | kjv | app | app-variant
    text: str


def variant(text: str, rng: random.Random) -> str:
    """The same query after the cache's normalisation (case folding, whitespace runs), typed
    differently."""
    words = text.split()
    style = rng.choice(("upper", "lower", "spaces", "lower-spaces"))
    if style == "upper":
        out = " ".join(words).upper()
    elif style == "lower":
        out = " ".join(words).lower()
    elif style == "spaces":
        out = "  " + "  ".join(words) + " "
    else:
        out = "\t".join(w.lower() for w in words) + "  "
    return out if normalise(out) == normalise(text) else text.upper()


def zipf_pick(rng: random.Random, items: Sequence[str], s: float, n: int) -> list[str]:
    weights = [1.0 / (rank + 1) ** s for rank in range(len(items))]
    return rng.choices(list(items), weights=weights, k=n)


def build_log(args: argparse.Namespace, sets: list[DataSet]) -> list[LogRequest]:
    """``args.requests`` requests: verses (a seeded draw of ``args.refs`` of the Bible set's
    labeled verses, Zipf popularity) worded as WEB, a variant, or the KJV text; AppStream
    summaries (``args.apps`` of the test queries, Zipf) as is or a variant; shuffled."""
    rng = random.Random(args.seed)
    by_key = {ds.key: ds for ds in sets}
    bible, apps = by_key["bible"], by_key["apps"]
    kjv_text = {d["doc_id"]: d["text"] for d in bible.labeled.documents}
    shares = [float(x) for x in args.wording.split(",")]
    refs = rng.sample(sorted(bible.labeled.queries), min(args.refs, len(bible.labeled.queries)))
    summaries = rng.sample(apps.labeled.test, min(args.apps, len(apps.labeled.test)))
    n_apps = round(args.requests * args.app_share)
    log: list[LogRequest] = []
    for qid in zipf_pick(rng, refs, args.zipf, args.requests - n_apps):
        web = bible.labeled.queries[qid]
        kind = rng.choices(("web", "variant", "kjv"), weights=shares)[0]
        if kind == "kjv":
            (verse,) = bible.labeled.qrels[qid]
            text = kjv_text[verse]
        else:
            text = web if kind == "web" else variant(web, rng)
        log.append(LogRequest("bible", bible.team, qid, kind, text))
    for qid in zipf_pick(rng, summaries, args.zipf, n_apps):
        text = apps.labeled.queries[qid]
        kind = "app" if rng.random() < 0.8 else "app-variant"
        log.append(
            LogRequest("apps", apps.team, qid, kind, text if kind == "app" else variant(text, rng))
        )
    rng.shuffle(log)
    return log


def log_summary(log: list[LogRequest], max_per_bucket: int) -> dict[str, Any]:
    """What the log makes possible: repeats of a normalised text (an exact hit if the entry
    is still there), requests for a label asked before in other words (a near-duplicate hit
    if the wordings are close enough), and the distinct texts per team's bucket."""
    kinds: dict[str, int] = {}
    for r in log:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    keys = {ds: {normalise(r.text) for r in log if r.set_key == ds} for ds in ("apps", "bible")}
    return {
        "requests": len(log),
        "kinds": kinds,
        "distinct_labels": len({(r.set_key, r.qid) for r in log}),
        "distinct_texts_per_bucket": {k: len(v) for k, v in keys.items()},
        "max_per_bucket": max_per_bucket,
    }


def opportunity(log: list[LogRequest]) -> list[str]:
    """Per request: ``repeat`` (its normalised text came before), ``reworded`` (its label
    came before in other words only) or ``new``."""
    texts: set[tuple[str, str]] = set()
    labels: set[tuple[str, str]] = set()
    out = []
    for r in log:
        text, label = (r.set_key, normalise(r.text)), (r.set_key, r.qid)
        out.append("repeat" if text in texts else "reworded" if label in labels else "new")
        texts.add(text)
        labels.add(label)
    return out


async def replay(
    client: httpx.AsyncClient, tokens: Tokens, log: list[LogRequest], label: str
) -> list[Answer]:
    progress = Progress(f"replay ({label})", len(log), "requests", 15.0)
    out = []
    for r in log:
        out.append(await search(client, tokens(CACHE, r.team), r.team, r.text))
        progress.add(1)
    return out


def ms_summary(seconds: Sequence[float]) -> dict[str, Any]:
    s = latency_summary(seconds)
    return {k: s[k] for k in ("n", "p50_ms", "p95_ms", "mean_ms") if k in s}


async def cache_phase(
    client: httpx.AsyncClient,
    tokens: Tokens,
    log: list[LogRequest],
    sets: list[DataSet],
    label: str,
    fresh_check: bool = True,
) -> dict[str, Any]:
    """Replay ``log`` with the cache agent; classify and time every answer; score each
    near-duplicate hit against a fresh uncached search of the same request."""
    qrels = {ds.key: ds.labeled.qrels for ds in sets}
    answers = await replay(client, tokens, log, label)
    chances = opportunity(log)
    outcome = []
    for a in answers:
        if not a.hit:
            outcome.append("miss")
        elif a.similarity is not None and a.similarity < 1.0:
            outcome.append("near")
        else:
            outcome.append("exact")
    statuses: dict[str, int] = {}
    for a in answers:
        status = str(a.cache.get("status"))
        statuses[status] = statuses.get(status, 0) + 1
    crosstab: dict[str, dict[str, int]] = {}
    for chance, out in zip(chances, outcome, strict=True):
        row = crosstab.setdefault(chance, {"exact": 0, "near": 0, "miss": 0})
        row[out] += 1
    by_outcome = {
        o: [a.seconds for a, oo in zip(answers, outcome, strict=True) if oo == o]
        for o in ("exact", "near", "miss")
    }
    hits = by_outcome["exact"] + by_outcome["near"]
    cache_stage = {
        o: [a.stages["cache"] for a, oo in zip(answers, outcome, strict=True) if oo == o]
        for o in ("exact", "near", "miss")
    }
    app_stage = {
        o: [a.stages["app"] for a, oo in zip(answers, outcome, strict=True) if oo == o]
        for o in ("exact", "near", "miss")
    }
    result: dict[str, Any] = {
        "label": label,
        "requests": len(log),
        "hit_ratio": round(len(hits) / len(log), 4),
        "exact_hits": len(by_outcome["exact"]),
        "near_hits": len(by_outcome["near"]),
        "misses": len(by_outcome["miss"]),
        "near_refused": statuses.get("near_refused", 0),
        "statuses": statuses,
        "opportunity_x_outcome": crosstab,
        "latency": {
            "hit": ms_summary(hits),
            "exact_hit": ms_summary(by_outcome["exact"]),
            "near_hit": ms_summary(by_outcome["near"]),
            "miss": ms_summary(by_outcome["miss"]),
        },
        "server_stage_p50_ms": {
            "cache": {o: round(percentile(v, 50), 2) for o, v in cache_stage.items() if v},
            "app": {o: round(percentile(v, 50), 2) for o, v in app_stage.items() if v},
        },
        "near_similarity": sorted(
            round(a.similarity, 4)
            for a, o in zip(answers, outcome, strict=True)
            if o == "near" and a.similarity is not None
        ),
    }
    lat = result["latency"]
    if lat["hit"].get("n") and lat["miss"].get("n"):
        result["hit_over_miss_p50"] = round(lat["hit"]["p50_ms"] / lat["miss"]["p50_ms"], 3)
        result["hit_over_miss_p95"] = round(lat["hit"]["p95_ms"] / lat["miss"]["p95_ms"], 3)
    per_kind: dict[str, dict[str, int]] = {}
    for r, o in zip(log, outcome, strict=True):
        row = per_kind.setdefault(r.kind, {"exact": 0, "near": 0, "miss": 0})
        row[o] += 1
    result["kind_x_outcome"] = per_kind
    logger.info(
        "cache %s: hit ratio %.3f (%d exact, %d near) of %d; hit p50 %s ms, miss p50 %s ms",
        label,
        result["hit_ratio"],
        result["exact_hits"],
        result["near_hits"],
        len(log),
        lat["hit"].get("p50_ms"),
        lat["miss"].get("p50_ms"),
    )
    if fresh_check:
        result["near_quality"] = await near_quality(client, tokens, log, answers, outcome, qrels)
    return result


async def near_quality(
    client: httpx.AsyncClient,
    tokens: Tokens,
    log: list[LogRequest],
    answers: list[Answer],
    outcome: list[str],
    qrels: dict[str, dict[str, dict[str, int]]],
) -> dict[str, Any]:
    """Each near-duplicate hit's answer against a fresh search of the same request by the
    uncached agent, both scored for the request's own label."""
    pairs: list[dict[str, Any]] = []
    for r, a, o in zip(log, answers, outcome, strict=True):
        if o != "near":
            continue
        fresh = await search(client, tokens(NOCACHE, r.team), r.team, r.text)
        rel = qrels[r.set_key][r.qid]
        pairs.append(
            {
                "set": r.set_key,
                "kind": r.kind,
                "similarity": a.similarity,
                "cached_ndcg": ndcg_at_k(a.docs, rel),
                "fresh_ndcg": ndcg_at_k(fresh.docs, rel),
                "same_top1": bool(a.docs and fresh.docs and a.docs[0] == fresh.docs[0]),
                "cached_top1_relevant": bool(a.docs and rel.get(a.docs[0], 0) > 0),
                "fresh_top1_relevant": bool(fresh.docs and rel.get(fresh.docs[0], 0) > 0),
            }
        )
    if not pairs:
        return {"n": 0}
    worse = [p for p in pairs if p["cached_ndcg"] < p["fresh_ndcg"] - 1e-9]
    return {
        "n": len(pairs),
        "cached_ndcg@10": round(statistics.fmean(p["cached_ndcg"] for p in pairs), 4),
        "fresh_ndcg@10": round(statistics.fmean(p["fresh_ndcg"] for p in pairs), 4),
        "same_top1": sum(p["same_top1"] for p in pairs),
        "cached_top1_relevant": sum(p["cached_top1_relevant"] for p in pairs),
        "fresh_top1_relevant": sum(p["fresh_top1_relevant"] for p in pairs),
        "cached_as_good": len(pairs) - len(worse),
        "worse": [
            {k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items()} for p in worse
        ][:20],
    }


# --- --near-check: distinct queries asked twice --------------------------------------------


def distinct_queries(ds: DataSet, n: int) -> list[str]:
    """The first ``n`` query ids (dev, then test) whose normalised texts are all distinct."""
    seen: set[str] = set()
    out = []
    for qid in [*ds.labeled.dev, *ds.labeled.test]:
        text = normalise(ds.labeled.queries[qid])
        if text not in seen:
            seen.add(text)
            out.append(qid)
        if len(out) == n:
            break
    return out


async def fresh_answers(
    client: httpx.AsyncClient, tokens: Tokens, ds: DataSet, qids: list[str]
) -> dict[str, Answer]:
    progress = Progress("fresh answers", len(qids), "queries", 15.0)
    out = {}
    for qid in qids:
        out[qid] = await search(client, tokens(NOCACHE, ds.team), ds.team, ds.labeled.queries[qid])
        progress.add(1)
    return out


async def twice_phase(
    client: httpx.AsyncClient,
    tokens: Tokens,
    ds: DataSet,
    qids: list[str],
    fresh: dict[str, Answer],
) -> dict[str, Any]:
    """Each distinct query asked twice by the cache agent of its own: how the first pass was
    answered (miss, near hit, near_refused), and the second (cached) answers' nDCG@10 against
    the fresh ones."""
    headers = tokens(CACHE_TWICE, ds.team)
    qrels = ds.labeled.qrels
    passes: list[list[Answer]] = []
    for label in ("first", "second"):
        progress = Progress(f"distinct queries, {label} pass", len(qids), "queries", 15.0)
        answers = []
        for qid in qids:
            answers.append(await search(client, headers, ds.team, ds.labeled.queries[qid]))
            progress.add(1)
        passes.append(answers)
    first, second = passes
    statuses: dict[str, int] = {}
    near: list[dict[str, Any]] = []
    for qid, a in zip(qids, first, strict=True):
        status = str(a.cache.get("status"))
        if a.hit and (a.similarity or 1.0) < 1.0:
            status = "near hit"
            f = fresh[qid]
            near.append(
                {
                    "query": ds.labeled.queries[qid],
                    "similarity": a.similarity,
                    "cached_ndcg": round(ndcg_at_k(a.docs, qrels[qid]), 4),
                    "fresh_ndcg": round(ndcg_at_k(f.docs, qrels[qid]), 4),
                    "same_top1": bool(a.docs and f.docs and a.docs[0] == f.docs[0]),
                }
            )
        statuses[status] = statuses.get(status, 0) + 1
    fresh_ndcg = [ndcg_at_k(fresh[q].docs, qrels[q]) for q in qids]
    cached_ndcg = [ndcg_at_k(a.docs, qrels[q]) for q, a in zip(qids, second, strict=True)]
    same_docs = sum(a.docs == fresh[q].docs for q, a in zip(qids, second, strict=True))
    return {
        "queries": len(qids),
        "first_pass": statuses,
        "second_pass_hits": sum(a.hit for a in second),
        "fresh_ndcg@10": round(statistics.fmean(fresh_ndcg), 4),
        "cached_ndcg@10": round(statistics.fmean(cached_ndcg), 4),
        "cached_worse": sum(c < f - 1e-9 for c, f in zip(cached_ndcg, fresh_ndcg, strict=True)),
        "cached_better": sum(c > f + 1e-9 for c, f in zip(cached_ndcg, fresh_ndcg, strict=True)),
        "same_docs_as_fresh": same_docs,
        "near_hits": near,
        "near_same_top1": sum(p["same_top1"] for p in near),
        "near_cached_ndcg@10": round(statistics.fmean(p["cached_ndcg"] for p in near), 4)
        if near
        else None,
        "near_fresh_ndcg@10": round(statistics.fmean(p["fresh_ndcg"] for p in near), 4)
        if near
        else None,
    }


async def run_near_check(args: argparse.Namespace, h: ServeHarness, folder: Path) -> dict[str, Any]:
    """``cache.near_check`` off (the first deployment) vs lexical (redeployed), one run."""
    tokens = Tokens(h.settings)
    sets = load_sets(args, extra_test=True)
    apps = next(ds for ds in sets if ds.key == "apps")
    result: dict[str, Any] = {
        "sets": {
            ds.key: {
                "name": ds.labeled.name,
                "team": ds.team,
                "documents": len(ds.labeled.documents),
            }
            for ds in sets
        }
    }
    result["write"] = write_sets(h, sets)
    log = build_log(args, sets)
    result["log"] = log_summary(log, h.settings.cache.max_per_bucket)
    qids = distinct_queries(apps, args.distinct)
    limits = httpx.Limits(max_connections=4)
    async with httpx.AsyncClient(base_url=h.base_url, timeout=120.0, limits=limits) as client:
        result["warm"] = [await warm(h, client, tokens, sets, args.warmup)]
        fresh = await fresh_answers(client, tokens, apps, qids)
        result["near_check"] = []
        runs = [
            (float(sim), mode)
            for sim in args.near_similarities.split(",")
            for mode in ("off", "lexical")
        ]
        for similarity, mode in runs:
            cache = h.settings.cache
            if (cache.near_check, cache.similarity) != (mode, similarity):
                h.redeploy({"cache": {"near_check": mode, "similarity": similarity}})
                result["warm"].append(await warm(h, client, tokens, sets, args.warmup))
            phase = await cache_phase(
                client, tokens, log, sets, f"memory, similarity {similarity:g}, near_check {mode}"
            )
            phase.update(backend="memory", similarity=similarity, near_check=mode)
            phase["twice"] = await twice_phase(client, tokens, apps, qids, fresh)
            phase["cache_status_after"] = (await readyz_components(client)).get("cache")
            logger.info(
                "near_check %s: %s",
                mode,
                {k: v for k, v in phase["twice"].items() if k != "near_hits"},
            )
            result["near_check"].append(phase)
    return result


def render_near_check(result: dict[str, Any]) -> str:
    rows, twice = [], []
    for c in result.get("near_check", []):
        n = c["requests"]
        q = c.get("near_quality") or {}
        rows.append(
            [
                f"{c['similarity']:g}",
                c["near_check"],
                n,
                f"{c['hit_ratio']:.3f} = {c['exact_hits'] / n:.3f} + {c['near_hits'] / n:.3f}",
                c["near_hits"],
                c["near_refused"],
                f"{q.get('same_top1', 0)}/{q.get('n', 0)}",
                f"{q['cached_ndcg@10']:.4f} / {q['fresh_ndcg@10']:.4f}" if q.get("n") else "–",
            ]
        )
        t = c["twice"]
        near_hits = t["first_pass"].get("near hit", 0)
        twice.append(
            [
                f"{c['similarity']:g}",
                c["near_check"],
                t["queries"],
                near_hits,
                t["first_pass"].get("near_refused", 0),
                f"{t['near_same_top1']}/{near_hits}",
                f"{t['near_cached_ndcg@10']:.4f} / {t['near_fresh_ndcg@10']:.4f}"
                if near_hits
                else "–",
                f"{t['fresh_ndcg@10']:.4f}",
                f"{t['cached_ndcg@10']:.4f}",
                f"{t['cached_worse']} / {t['cached_better']}",
            ]
        )
    log = result.get("log", {})
    kinds = ", ".join(f"{k} {v}" for k, v in log.get("kinds", {}).items())
    return (
        f"**Replayed log** ({log.get('requests')} requests: {kinds})\n\n"
        + markdown_table(
            [
                "similarity",
                "near_check",
                "requests",
                "hit ratio = exact + near",
                "near hits served",
                "near refused",
                "near hits: same top-1 as fresh",
                "near hits: nDCG@10 cached / fresh",
            ],
            rows,
        )
        + "\n\n**Distinct AppStream summaries asked twice**\n\n"
        + markdown_table(
            [
                "similarity",
                "near_check",
                "queries",
                "near hits (1st pass)",
                "near refused (1st pass)",
                "near hits: same top-1 as fresh",
                "near hits: nDCG@10 cached / fresh",
                "nDCG@10 fresh",
                "nDCG@10 cached (2nd pass)",
                "cached worse / better",
            ],
            twice,
        )
    )


# --- phase 3: MCP --------------------------------------------------------------------------


def app_ms(headers: Any) -> float | None:
    return parse_server_timing(headers.get("server-timing", "")).get("app")


@dataclass
class McpPaths:
    http: Any
    mcp: Any
    team: str
    server_ms: list[float] = field(default_factory=list)

    async def route(self, query: str) -> tuple[float, float | None, list[str]]:
        t0 = time.perf_counter()
        body = {"team_id": self.team, "query": query, "top_k": TOP_K}
        r = await self.http.post("/rag/search_docs", json=body)
        took = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"/rag/search_docs {r.status_code}: {r.text[:300]}")
        return took, app_ms(r.headers), [m["chunk_id"] for m in r.json()["matches"]]

    async def tool(self, query: str) -> tuple[float, float | None, list[str]]:
        t0 = time.perf_counter()
        r = await self.http.post(f"/tools/{TOOL}", json={"query": query, "top_k": TOP_K})
        took = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"/tools/{TOOL} {r.status_code}: {r.text[:300]}")
        return took, app_ms(r.headers), [m["chunk_id"] for m in r.json()["matches"]]

    async def call_mcp(self, query: str) -> tuple[float, float | None, list[str]]:
        self.server_ms.clear()
        t0 = time.perf_counter()
        result = await self.mcp.call_tool(TOOL, {"query": query, "top_k": TOP_K})
        took = time.perf_counter() - t0
        if result.is_error:
            raise RuntimeError(f"MCP tool error: {result.content[0].text[:300]}")
        data = result.structured_content or {}
        server = sum(self.server_ms) if self.server_ms else None
        return took, server, [m["chunk_id"] for m in data.get("matches", [])]


@asynccontextmanager
async def mcp_paths(base_url: str, headers: dict[str, str], team: str) -> AsyncIterator[McpPaths]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(30.0, read=120.0)
    paths: McpPaths | None = None

    async def on_response(response: Any) -> None:
        ms = app_ms(response.headers)
        if paths is not None and ms is not None:
            paths.server_ms.append(ms)

    http = httpx2.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)
    mcp_http = httpx2.AsyncClient(
        headers=headers, timeout=timeout, event_hooks={"response": [on_response]}
    )
    client = Client(
        streamable_http_client(f"{base_url}/mcp", http_client=mcp_http), mode="auto", cache=None
    )
    async with http, mcp_http, client:
        paths = McpPaths(http, client, team)
        yield paths


async def mcp_phase(
    h: ServeHarness, tokens: Tokens, sets: list[DataSet], n: int, warmup: int
) -> dict[str, Any]:
    """``n`` AppStream test queries through the route, the tool route and MCP, interleaved
    per query (rotating order), uncached."""
    apps = next(ds for ds in sets if ds.key == "apps")
    qids = apps.labeled.test
    texts = [apps.labeled.queries[q] for q in qids]
    headers = tokens(NOCACHE, apps.team)
    samples: dict[str, dict[str, list[float]]] = {
        p: {"client": [], "server": []} for p in ("route", "tool", "mcp")
    }
    differ = 0
    step, protocol = "connect to /mcp", None
    try:
        async with mcp_paths(h.base_url, headers, apps.team) as paths:
            calls = {"route": paths.route, "tool": paths.tool, "mcp": paths.call_mcp}
            protocol = getattr(paths.mcp, "protocol_version", None)
            step = "warm-up call"
            for text in texts[-warmup:]:
                found = [await calls[p](text) for p in calls]
                differ += len({tuple(f[2]) for f in found}) > 1
            step = "measured call"
            names = list(calls)
            progress = Progress("MCP overhead", n * len(names), "calls", 15.0)
            for i, text in enumerate(texts[:n]):
                for name in names[i % 3 :] + names[: i % 3]:
                    took, server, _ = await calls[name](text)
                    samples[name]["client"].append(took)
                    if server is not None:
                        samples[name]["server"].append(server / 1000)
                    progress.add(1)
    except Exception as exc:
        logger.warning("MCP phase skipped: %s failed: %r", step, exc)
        return {"skipped": f"{step} failed: {exc!r}", "mcp_protocol": protocol}
    summary = {
        name: {"client": latency_summary(s["client"]), "server": latency_summary(s["server"])}
        for name, s in samples.items()
    }

    def ratio(a: str, b: str, p: str) -> float:
        return round(summary[a]["client"][f"{p}_ms"] / summary[b]["client"][f"{p}_ms"], 3)

    out = {
        "mcp_protocol": protocol,
        "queries": n,
        "warmup_answers_differ": differ,
        "summary": summary,
        "ratios": {
            f"{a}/{b}": {p: ratio(a, b, p) for p in ("p50", "p95")}
            for a, b in (("mcp", "tool"), ("mcp", "route"), ("tool", "route"))
        },
    }
    logger.info(
        "MCP: route p50 %s, tool p50 %s, mcp p50 %s ms; %s",
        summary["route"]["client"]["p50_ms"],
        summary["tool"]["client"]["p50_ms"],
        summary["mcp"]["client"]["p50_ms"],
        out["ratios"],
    )
    return out


# --- the run -------------------------------------------------------------------------------


async def clear_redis(url: str, prefix: str) -> int:
    from serve_app.search.cache.store import RedisCacheStore

    store = RedisCacheStore(url, prefix, 256, 5.0)
    try:
        return await store.clear()
    finally:
        await store.close()


async def run(args: argparse.Namespace, h: ServeHarness, folder: Path) -> dict[str, Any]:
    tokens = Tokens(h.settings)
    sets = load_sets(args)
    result: dict[str, Any] = {
        "sets": {
            ds.key: {
                "name": ds.labeled.name,
                "team": ds.team,
                "documents": len(ds.labeled.documents),
                "dev": len(ds.labeled.dev),
                "test": len(ds.labeled.test),
            }
            for ds in sets
        }
    }
    result["write"] = write_sets(h, sets)
    log = build_log(args, sets)
    result["log"] = log_summary(log, h.settings.cache.max_per_bucket)
    logger.info("query log: %s", result["log"])
    limits = httpx.Limits(max_connections=4)
    async with httpx.AsyncClient(base_url=h.base_url, timeout=120.0, limits=limits) as client:
        result["warm"] = [await warm(h, client, tokens, sets, args.warmup)]
        if args.strict_min_score is None:
            result["min_score_tuning"] = await tune_min_score(
                client, tokens, sets, args.dev_queries, args.min_score_loss
            )
            strict_floor = result["min_score_tuning"]["chosen"]
        else:
            strict_floor = args.strict_min_score
        result["strict_min_score"] = strict_floor
        # Phase 2 on the first deployment: the cache at its default threshold, in memory.
        similarity = h.settings.cache.similarity
        result["cache"] = [
            await cache_phase(client, tokens, log, sets, f"memory, similarity {similarity:g}")
        ]
        result["cache"][-1].update(backend="memory", similarity=similarity)
        result["cache_status_after"] = (await readyz_components(client)).get("cache")
        # Phase 3: MCP against the route and the tool route.
        try:
            result["mcp"] = await mcp_phase(h, tokens, sets, args.mcp_queries, 3)
        except Exception as exc:
            logger.exception("MCP phase failed")
            result["mcp"] = {"skipped": f"failed: {exc!r}"}
        # Phase 1 on a deployment with the tuned strict profile (and the second threshold).
        second = args.second_similarity
        update: dict[str, Any] = {
            "profiles": {"file": str(write_profiles(folder, "profiles-2.yaml", strict_floor))}
        }
        if second:
            update["cache"] = {"similarity": second}
        h.redeploy(update)
        result["warm"].append(await warm(h, client, tokens, sets, args.warmup))
        result["profiles"] = await profiles_phase(client, tokens, sets, args.profile_queries)
        if second:
            phase = await cache_phase(client, tokens, log, sets, f"memory, similarity {second:g}")
            phase.update(backend="memory", similarity=second)
            result["cache"].append(phase)
        # Phase 4: Redis.
        if args.redis_url:
            prefix = f"bench_agent_tools:{secrets.token_hex(4)}:"
            try:
                h.redeploy(
                    {
                        "cache": {
                            "backend": "redis",
                            "redis_url": args.redis_url,
                            "redis_prefix": prefix,
                            "similarity": similarity,
                        }
                    }
                )
                result["warm"].append(await warm(h, client, tokens, sets, args.warmup))
                phase = await cache_phase(
                    client, tokens, log, sets, f"redis, similarity {similarity:g}", False
                )
                phase.update(backend="redis", similarity=similarity)
                result["cache"].append(phase)
                result["redis_status"] = (await readyz_components(client)).get("cache")
            except Exception as exc:
                logger.exception("Redis phase failed")
                result["redis"] = {"skipped": f"failed: {exc!r}"}
            finally:
                try:
                    dropped = await clear_redis(args.redis_url, prefix)
                    logger.info("deleted %d cache values under %s in Redis", dropped, prefix)
                except Exception:
                    logger.exception("could not delete the Redis keys under %s", prefix)
    return result


# --- the tables ----------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render(result: dict[str, Any]) -> str:
    parts = []
    sets = result.get("sets", {})
    names = ", ".join(f"{k}: {v['name']} ({v['documents']} documents)" for k, v in sets.items())
    parts.append(f"Data: {names}. top_k {TOP_K}, concurrency 1, JWT auth.")
    tuning = result.get("min_score_tuning")
    floor = result.get("strict_min_score")
    if tuning:
        parts.append(
            f"bench_strict min_score {floor:.2f}: the highest costing at most "
            f"{tuning['max_loss']} dev nDCG@10 on either set (the fused score is normalised per "
            f"query: top-1 score min {tuning['top1_score']['min']:.2f}, median "
            f"{tuning['top1_score']['median']:.2f})."
        )
    rows = []
    for r in result.get("profiles", {}).get("rows", []):
        lat = r["latency"]
        rows.append(
            [
                r["set"],
                f"{r['profile']} ({r['rag_mode']})",
                lat["n"],
                fmt(lat["p50_ms"]),
                fmt(lat["p95_ms"]),
                f"{r['p50_vs_default']:.2f}×",
                f"{r['ndcg@10']:.4f}",
                f"{r['recall@10']:.4f}",
                fmt(r["passages"]),
            ]
        )
    if rows:
        parts.append(
            "**Profiles** (POST /rag/search_docs, cache bypassed, test queries)\n\n"
            + markdown_table(
                [
                    "set",
                    "profile",
                    "queries",
                    "p50 ms",
                    "p95 ms",
                    "p50 vs default",
                    "nDCG@10",
                    "Recall@10",
                    "passages/answer",
                ],
                rows,
            )
        )
    log = result.get("log", {})
    rows, quality = [], []
    for c in result.get("cache", []):
        lat = c["latency"]
        ct = c["opportunity_x_outcome"]
        repeat, reworded, new = (ct.get(k, {}) for k in ("repeat", "reworded", "new"))
        n = c["requests"]
        rows.append(
            [
                c["backend"],
                f"{c['similarity']:g}",
                c["requests"],
                f"{c['hit_ratio']:.3f} = {c['exact_hits'] / n:.3f} + {c['near_hits'] / n:.3f}",
                f"{repeat.get('exact', 0)} + {repeat.get('near', 0)} / {sum(repeat.values())}",
                f"{reworded.get('near', 0)} / {sum(reworded.values())}",
                new.get("near", 0),
                fmt(lat["exact_hit"].get("p50_ms")),
                fmt(lat["near_hit"].get("p50_ms")),
                fmt(lat["hit"].get("p95_ms")),
                fmt(lat["miss"].get("p50_ms")),
                fmt(lat["miss"].get("p95_ms")),
                f"{c['hit_over_miss_p50']:.2f}×" if "hit_over_miss_p50" in c else "–",
            ]
        )
        q = c.get("near_quality")
        if q and q.get("n"):
            quality.append(
                [
                    f"{c['backend']} {c['similarity']:g}",
                    q["n"],
                    f"{q['cached_ndcg@10']:.4f}",
                    f"{q['fresh_ndcg@10']:.4f}",
                    f"{q['cached_as_good']}/{q['n']}",
                    f"{q['same_top1']}/{q['n']}",
                    f"{q['cached_top1_relevant']} / {q['fresh_top1_relevant']}",
                ]
            )
        elif q is not None:
            quality.append([f"{c['backend']} {c['similarity']:g}", 0, "–", "–", "–", "–", "–"])
    if rows:
        kinds = ", ".join(f"{k} {v}" for k, v in log.get("kinds", {}).items())
        parts.append(
            f"**Semantic cache** (replayed log of {log.get('requests')} requests over "
            f"{log.get('distinct_labels')} labels: {kinds}; distinct texts per bucket "
            f"{log.get('distinct_texts_per_bucket')}, max_per_bucket {log.get('max_per_bucket')})"
            "\n\n"
            + markdown_table(
                [
                    "backend",
                    "similarity",
                    "requests",
                    "hit ratio = exact + near",
                    "repeats hit exact + near / repeats",
                    "rewordings hit near / rewordings",
                    "near hits on a new label",
                    "exact hit p50 ms",
                    "near hit p50 ms",
                    "hit p95 ms",
                    "miss p50 ms",
                    "miss p95 ms",
                    "hit/miss p50",
                ],
                rows,
            )
            + "\n\nA repeat: its normalised text was asked before in the log; a rewording: its "
            "label (verse, component) was asked before in other words only; a near hit on a new "
            "label answers with another label's result. Latency: client, the cache agent's token."
        )
    if quality:
        parts.append(
            "**Near-duplicate hits: the cached answer vs a fresh search of the same request** "
            "(nDCG@10 for the request's own label)\n\n"
            + markdown_table(
                [
                    "cache",
                    "near hits",
                    "cached nDCG@10",
                    "fresh nDCG@10",
                    "cached ≥ fresh",
                    "same top-1",
                    "top-1 relevant cached / fresh",
                ],
                quality,
            )
            + "\n\nA fresh search of a KJV-worded request is a search for the document's own "
            "text, so its fresh nDCG is close to 1."
        )
    m = result.get("mcp", {})
    if m.get("skipped"):
        parts.append(f"**MCP**: skipped — {m['skipped']}")
    elif m:
        s = m["summary"]
        base = s["route"]["client"]["p50_ms"]
        tool = s["tool"]["client"]["p50_ms"]
        rows = []
        for name, label in (
            ("route", "POST /rag/search_docs"),
            ("tool", f"POST /tools/{TOOL}"),
            ("mcp", f"MCP call_tool {TOOL}"),
        ):
            c, srv = s[name]["client"], s[name]["server"]
            rows.append(
                [
                    label,
                    c["n"],
                    fmt(c["p50_ms"]),
                    fmt(c["p95_ms"]),
                    f"{c['p50_ms'] / base:.2f}×",
                    f"{c['p50_ms'] / tool:.2f}×",
                    fmt(srv.get("p50_ms")),
                ]
            )
        parts.append(
            f"**MCP overhead** (protocol {m['mcp_protocol']}, uncached, interleaved per query; "
            f"warm-up answers that differ between paths: {m['warmup_answers_differ']})\n\n"
            + markdown_table(
                [
                    "path",
                    "calls",
                    "p50 ms",
                    "p95 ms",
                    "p50 vs route",
                    "p50 vs tool route",
                    "server app p50 ms",
                ],
                rows,
            )
        )
    if result.get("redis", {}).get("skipped"):
        parts.append(f"**Redis**: skipped — {result['redis']['skipped']}")
    anomalies = result.get("profiles", {}).get("anomalies")
    if anomalies:
        parts.append("Anomalies: " + "; ".join(anomalies))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if not args.verbose:
        logging.getLogger("httpx2").setLevel(logging.WARNING)
        logging.getLogger("mcp").setLevel(logging.WARNING)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, min(getattr(args, key), value))
    folder = Path(tempfile.mkdtemp(prefix="bench_agent_tools_", dir="/tmp"))
    try:
        settings: dict[str, Any] = {
            "auth": {"mode": "jwt", "hs256_secret": SECRET},
            "profiles": {"file": str(write_profiles(folder, "profiles-1.yaml", None))},
            # The cache's index generations in a state database of this run only.
            "state": {"url": f"sqlite:///{folder / 'state.db'}"},
            "cache": {"enabled": True, "backend": "memory"},
        }
        if args.near_check:
            first = float(args.near_similarities.split(",")[0])
            # Every distinct query's entry must still be there for its second ask (the
            # default 256 per bucket would evict them oldest first, each before its repeat).
            per_bucket = max(256, args.distinct + 64)
            settings["cache"].update(near_check="off", similarity=first, max_per_bucket=per_bucket)
            # Hits come back faster than the per-credential limit of 200 requests/s.
            settings["rate_limit"] = {"enabled": False}
        harness = ServeHarness(
            port=args.port, collection=COLLECTION, graph_enabled=False, settings=settings
        )
        result: dict[str, Any] = {
            "benchmark": "agent_tools",
            "args": vars(args),
            "environment": environment_info(),
            "cache_settings": harness.settings.cache.model_dump(),
            "search_settings": harness.settings.search.model_dump(),
        }
        if args.near_check:
            run_benchmark(
                "near_check",
                harness,
                result,
                lambda h: run_near_check(args, h, folder),
                render_near_check,
                args.out,
            )
        else:
            run_benchmark(
                "agent_tools", harness, result, lambda h: run(args, h, folder), render, args.out
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
