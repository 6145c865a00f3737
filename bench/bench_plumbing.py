"""Search plumbing (issue 37): the floor, the gateway per path and a Haystack peer, one run.

For the same real queries on the same ≥ 15k real-text chunks, in one run:

1. **The floor**, in this process: one query embedding with the model the gateway uses
   (``EmbedderCore``, the shipped embedder settings: ONNX int8 by default) + an exact numpy
   dense top-k + a ``bm25s`` top-k; per path (hybrid = all three, dense = embedding + numpy,
   bm25 = bm25s alone), before and after the gateway's phase, medians pooled.
2. **The gateway per path**, shipped defaults (``bench.serve_harness``; JWT auth, the
   semantic cache **on**, as shipped): ``hybrid`` (the default search), ``dense`` and
   ``bm25`` (``search_mode``), and ``cached`` (the hybrid queries again, from the same
   callers: exact repeats, answered by the semantic cache). Closed loop at each
   ``--concurrency``; the paths are interleaved within each repetition (hybrid, cached,
   dense, bm25) and every repetition and concurrency uses fresh callers (JWT subjects), so
   only ``cached`` is ever answered from the cache. Each concurrent caller has its own
   credential (8 agents, not one agent 8 times: one credential is rate-limited at 50/s).
   Per level: client p50/p95, requests/s, the server's stages (``Server-Timing``), and the
   **CPU milliseconds per request of every process** (HTTP proxy, Ingress, Embedder,
   Retriever, Milvus, this client, Ray's own), from ``psutil`` around the level.
3. **The peer** (``--peer``; default: when ``var/peers/haystack`` exists): Haystack 2 +
   milvus-haystack hybrid (dense + Milvus's BM25 function, RRF), flushed after loading, the
   same chunks, vectors and queries, served by FastAPI (``bench/peer_haystack_search.py``),
   before the gateway starts (so neither shares the CPUs with the other).

Real text: the AppStream catalogue (2,365 chunks; its component summaries are the queries,
labelled) plus KJV verses up to ``--chunks``. nDCG@10 per path on the labelled queries.

    .venv/bin/python -m bench.bench_plumbing --help
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import realtext
from bench.bench_search_real import (
    SECRET,
    Floor,
    parse_server_timing,
    write_chunks,
)
from bench.common import (
    DEFAULT_PORT,
    REPO_ROOT,
    RESULTS_DIR,
    closed_loop,
    environment_info,
    latency_summary,
    markdown_table,
    parse_int_list,
    setup_logging,
)
from bench.http_clients import CLIENTS, open_client
from bench.profiles import SpyGroup
from bench.quality.metrics import distinct, evaluate
from bench.serve_harness import ServeHarness, deep_merge, run_benchmark

logger = logging.getLogger("bench.plumbing")
stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
PATHS = ("hybrid", "cached", "dense", "bm25")
PEER_PYTHON = REPO_ROOT / "var" / "peers" / "haystack" / "bin" / "python"
# psutil process names → the role in the tables (first match wins).
ROLES = (
    ("ServeReplica:rag:Ingress", "ingress"),
    ("ServeReplica:rag:Embedder", "embedder"),
    ("ServeReplica:rag:Retriever", "retriever"),
    ("ServeReplica:rag:Graph", "graph"),
    ("ProxyActor", "proxy"),
    ("haproxy", "proxy"),
    ("milvus", "milvus"),
    ("peer_haystack_search", "peer"),
    ("ray::", "ray"),
    ("raylet", "ray"),
    ("gcs_server", "ray"),
    ("ray/", "ray"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_plumbing",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--collection", default="bench_plumbing", help="must start with bench_")
    p.add_argument("--team", default="bench_plumbing_t0")
    p.add_argument("--chunks", type=int, default=17_000, help="AppStream + KJV verses to this")
    p.add_argument("--queries", type=int, default=400, help="AppStream summaries, labelled")
    p.add_argument("--top-k", type=int, default=30)
    p.add_argument("--concurrency", type=parse_int_list, default="1,8")
    p.add_argument("--requests", type=parse_int_list, default="200,400", help="per level")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--paths", default=",".join(PATHS), help="of " + ",".join(PATHS))
    p.add_argument("--floor-queries", type=int, default=200)
    p.add_argument(
        "--level-floor-queries",
        type=int,
        default=100,
        help="the floor measured again before each level and after the last, on this many "
        "queries: each level's ratio to the floor beside it",
    )
    p.add_argument(
        "--peer",
        choices=("auto", "on", "off"),
        default="auto",
        help="the Haystack peer (auto: when var/peers/haystack exists)",
    )
    p.add_argument("--peer-reps", type=int, default=2)
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the Serve replicas (and Serve's Python proxy) in the first repetition",
    )
    p.add_argument(
        "--serve-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment of the local Ray cluster (e.g. RAY_SERVE_ENABLE_HA_PROXY=0)",
    )
    p.add_argument(
        "--ingress-replicas",
        type=int,
        default=None,
        help="Ingress replicas (default: the app's one; each holds its own in-memory index)",
    )
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="JSON",
        help='GatewaySettings overrides, deep-merged, e.g. \'{"milvus": {"memory_index": '
        '{"serve_from": "retriever"}}}\'',
    )
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="ROLE=CPUS",
        help="during the gateway's levels, keep every thread of a role's processes on these "
        "CPUs (e.g. ingress=1 proxy=0 client=0; CPUS as 0 or 0,1): does a request's step "
        "find its cache warmer when its process stays on one core?",
    )
    p.add_argument(
        "--client",
        choices=CLIENTS,
        default="httpx",
        help="the HTTP client of the timed requests, gateway and peer (bench/http_clients.py: "
        "httpx parses in Python, aiohttp in C; the warm-up always uses httpx)",
    )
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def pin(specs: list[str]) -> dict[str, list[int]]:
    """Sets the CPU affinity of every thread of each named role's processes."""
    wanted = {}
    for spec in specs:
        role, _, cpus = spec.partition("=")
        wanted[role] = sorted({int(c) for c in cpus.split(",") if c})
    done: dict[str, list[int]] = {}
    for proc in psutil.process_iter(["cmdline"]):
        role = role_of(proc.pid, " ".join(proc.info["cmdline"] or ()))
        if role not in wanted:
            continue
        try:
            for thread in proc.threads():
                os.sched_setaffinity(thread.id, wanted[role])
        except (psutil.Error, OSError) as exc:
            logger.warning("pin %s %s: %s", role, proc.pid, exc)
            continue
        done.setdefault(role, []).append(proc.pid)
    logger.info("pinned %s to %s", done, wanted)
    return {role: wanted[role] for role in done}


# --- who spends the CPU ---------------------------------------------------------------------
def role_of(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "client"
    for needle, role in ROLES:
        if needle in cmdline:
            return role
    return "other"


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """pid → (role, CPU seconds user + system) of every process."""
    out = {}
    for proc in psutil.process_iter(["cmdline", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is None:
            continue
        cmd = " ".join(proc.info["cmdline"] or ()) or proc.name()
        out[proc.pid] = (role_of(proc.pid, cmd), times.user + times.system)
    return out


def cpu_ms_per_request(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], n: int
) -> dict[str, float]:
    """Each role's CPU milliseconds per request between two snapshots (``total`` too)."""
    spent: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        if pid in before:
            spent[role] = spent.get(role, 0.0) + seconds - before[pid][1]
    out = {role: round(1000 * s / max(n, 1), 2) for role, s in spent.items() if s > 0}
    out["total"] = round(sum(out.values()), 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# --- callers --------------------------------------------------------------------------------
def token(team: str, settings: Any, subject: str, ops: bool = False) -> str:
    """A member of ``team``; ``ops``: may also read /readyz's details (the memory index)."""
    import jwt

    now = int(time.time())
    claims: dict[str, Any] = {"sub": subject, "iat": now, "exp": now + 86_400}
    claims[settings.auth.claims.teams] = {team: ["member"]}
    if ops:
        claims[settings.auth.claims.permissions] = [settings.surface.details_permission]
    return jwt.encode(claims, SECRET, "HS256")


def search_body(args: argparse.Namespace, query: str, path: str) -> dict[str, Any]:
    body: dict[str, Any] = {"team_id": args.team, "query": query, "top_k": args.top_k}
    if path in ("dense", "bm25"):
        body["search_mode"] = path
    return body


async def level(
    client: Any,
    args: argparse.Namespace,
    queries: list[tuple[str, str]],
    path: str,
    concurrency: int,
    tokens: list[str],
    profile: bool = False,
) -> dict[str, Any]:
    """One closed-loop level of ``path``; query ``i`` is sent by caller ``i % len(tokens)``
    (so a repeat of the level reaches the same callers' cache entries)."""
    took: list[float] = []
    stages: dict[str, list[float]] = {}
    runs: dict[str, list[str]] = {}
    hits = 0
    index = {qid: i for i, (qid, _) in enumerate(queries)}
    text = dict(queries)

    async def call(qid: str) -> None:
        nonlocal hits
        headers = {"authorization": f"Bearer {tokens[index[qid] % len(tokens)]}"}
        body = search_body(args, text[qid], path)
        resp = await client.post("/rag/search_docs", json=body, headers=headers)
        if resp.status_code != 200:
            raise RuntimeError(f"search answered {resp.status_code}: {resp.text[:300]}")
        data = resp.json()
        took.append(float(data["took_ms"]))
        hits += bool((data.get("cache") or {}).get("hit"))
        runs[qid] = distinct([m["source_ref"]["id"] for m in data["matches"]])
        for name, ms in parse_server_timing(resp.headers.get("server-timing", "")).items():
            stages.setdefault(name, []).append(ms)

    spies = None
    if profile:
        spies = SpyGroup(RESULTS_DIR / "spy", f"{stamp}-{path}-c{concurrency}")
        spies.start(serve_pids())
    before = cpu_by_process()
    wall, latencies, _, errors = await closed_loop([q for q, _ in queries], concurrency, call)
    cpu = cpu_ms_per_request(before, cpu_by_process(), len(latencies))
    profiles = spies.stop() if spies is not None else None
    for exc in errors[:3]:
        logger.error("%s search failed: %s", path, exc)
    return {
        "path": path,
        "concurrency": concurrency,
        "requests": len(queries),
        "errors": len(errors),
        "cache_hits": hits,
        "requests_per_s": round(len(latencies) / wall, 2),
        "latency": latency_summary(latencies),
        "server_took_p50_ms": round(statistics.median(took), 2) if took else None,
        "stages_p50_ms": {k: round(statistics.median(v), 2) for k, v in stages.items()},
        "cpu_ms_per_request": cpu,
        "profiles": profiles,
        "runs": runs,
    }


def serve_pids() -> dict[str, int]:
    """role → pid of the Serve replicas of the app and of Serve's Python proxy (if any)."""
    out = {}
    for proc in psutil.process_iter(["cmdline"]):
        role = role_of(proc.pid, " ".join(proc.info["cmdline"] or ()))
        if role in ("ingress", "embedder", "retriever", "proxy") and "haproxy" not in str(
            proc.info["cmdline"]
        ):
            out[role] = proc.pid
    return out


def summarise(reps: list[dict[str, Any]], qrels: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Medians over the repetitions of one (path, concurrency); nDCG@10 of the first."""
    first = reps[0]["runs"]
    roles = sorted({r for rep in reps for r in rep["cpu_ms_per_request"]})
    out = {
        "path": reps[0]["path"],
        "concurrency": reps[0]["concurrency"],
        "p50_ms": statistics.median(r["latency"]["p50_ms"] for r in reps),
        "p95_ms": statistics.median(r["latency"]["p95_ms"] for r in reps),
        "p50_over_floor_beside": statistics.median(r["p50_over_floor_beside"] for r in reps),
        "requests_per_s": statistics.median(r["requests_per_s"] for r in reps),
        "server_took_p50_ms": statistics.median(r["server_took_p50_ms"] or 0 for r in reps),
        "stages_p50_ms": reps[len(reps) // 2]["stages_p50_ms"],
        "cpu_ms_per_request": {
            role: statistics.median(r["cpu_ms_per_request"].get(role, 0.0) for r in reps)
            for role in roles
        },
        "errors": sum(r["errors"] for r in reps),
        "cache_hits": sum(r["cache_hits"] for r in reps),
        "requests": sum(r["requests"] for r in reps),
        "ndcg@10": round(evaluate(first, {q: qrels[q] for q in first})["ndcg@10"], 4),
        "profiles": reps[0].get("profiles"),
    }
    for r in reps:
        r.pop("runs", None)
    out["reps"] = reps
    return out


# --- the corpus -----------------------------------------------------------------------------
def corpus(args: argparse.Namespace, settings: Any) -> tuple[Any, list[Any], list[tuple]]:
    """The labelled AppStream set, its chunks plus KJV verses up to ``--chunks`` (real
    embeddings, cached under bench/results/cache), and the queries ``(qid, text)``."""
    labeled = realtext.appstream(args.team)
    chunks = realtext.embed_chunks(
        realtext.build_chunks(labeled.documents, settings), settings, name="appstream"
    )
    extra = max(args.chunks - len(chunks), 0)
    if extra:
        kjv = realtext.build_chunks(realtext.kjv_documents(args.team, extra), settings)
        chunks += realtext.embed_chunks(kjv, settings, name="kjv")
    qids = sorted(labeled.queries)[: args.queries]
    return labeled, chunks, [(q, labeled.queries[q]) for q in qids]


def floor(settings: Any, chunks: list[Any], args: argparse.Namespace) -> Floor:
    return Floor(settings, chunks, args.top_k * settings.search.candidate_multiplier)


def beside(level: dict[str, Any], before: dict, after: dict) -> None:
    """Sets the level's ``floor_beside_ms`` (the floor of its path from the passes measured
    just before and just after it, pooled) and its p50 over that floor: a ratio the VM's
    drift over a whole run moves less than the ratio to the run's floor."""
    key = "hybrid" if level["path"] == "cached" else level["path"]
    ms = floor_per_path(before, after)[key]
    level["floor_beside_ms"] = ms
    level["p50_over_floor_beside"] = round(level["latency"]["p50_ms"] / ms, 3)


def floor_per_path(*passes: dict[str, list[float]]) -> dict[str, Any]:
    """Per path, the median over both passes' queries pooled, and each pass's own."""

    def per_query(p: dict[str, list[float]], path: str) -> list[float]:
        if path == "hybrid":
            return p["total"]
        if path == "dense":
            return [e + d for e, d in zip(p["embed"], p["dense"], strict=True)]
        return p["bm25"]

    out: dict[str, Any] = {
        part: round(statistics.median(x for p in passes for x in p[part]), 3)
        for part in ("embed", "dense", "bm25")
    }
    for path in ("hybrid", "dense", "bm25"):
        out[path] = round(statistics.median(x for p in passes for x in per_query(p, path)), 3)
        out[f"{path}_passes"] = [round(statistics.median(per_query(p, path)), 3) for p in passes]
    return out


# --- the gateway ----------------------------------------------------------------------------
async def gateway(args: argparse.Namespace, h: ServeHarness) -> dict[str, Any]:
    settings = h.settings
    labeled, chunks, queries = corpus(args, settings)
    texts = [t for _, t in queries]
    store = h.milvus_store()
    store.start()
    result: dict[str, Any] = {"chunks": len(chunks), "queries": len(queries)}
    result["write_s"] = round(write_chunks(store, chunks, "AppStream + KJV", False), 1)
    store.close()
    the_floor = floor(settings, chunks, args)
    before = the_floor.sample(texts, args.floor_queries)
    paths = [p for p in args.paths.split(",") if p]
    levels: dict[tuple[str, int], list[dict[str, Any]]] = {}
    timeline: list[tuple[dict[str, Any], dict[str, list[float]]]] = []
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    timed = open_client(args.client, h.base_url, 120.0, max(args.concurrency) + 4)
    async with (
        httpx.AsyncClient(base_url=h.base_url, timeout=120.0, limits=limits) as warm_client,
        timed as client,
    ):
        warm = [token(args.team, settings, "bench-warm", ops=True)]
        await warm_up(warm_client, args, queries, warm, len(chunks))
        if args.pin:
            result["pinned"] = pin(args.pin)
        for rep in range(args.reps):
            for c, n in zip(args.concurrency, args.requests, strict=True):
                callers = [
                    token(args.team, settings, f"bench-r{rep}-c{c}-{i}") for i in range(max(c, 1))
                ]
                for path in paths:
                    group = (
                        callers
                        if path in ("hybrid", "cached")
                        else [
                            token(args.team, settings, f"bench-r{rep}-c{c}-{path}-{i}")
                            for i in range(max(c, 1))
                        ]
                    )
                    profile = args.profile and rep == 0
                    near = the_floor.sample(texts, args.level_floor_queries)
                    if timeline:
                        beside(timeline[-1][0], timeline[-1][1], near)
                    res = await level(client, args, queries[:n], path, c, group, profile)
                    log_level(rep, res)
                    levels.setdefault((path, c), []).append(res)
                    timeline.append((res, near))
        components = (await warm_client.get("/readyz", headers=auth(warm[0]))).json()
        result["empty"] = [
            await empty_level(client, c, n)
            for c, n in zip(args.concurrency, args.requests, strict=True)
        ]
    after = the_floor.sample(texts, args.floor_queries)
    if timeline:
        beside(timeline[-1][0], timeline[-1][1], after)
    result["floor"] = floor_per_path(before, after)
    logger.info("floor: %s", result["floor"])
    result["levels"] = [summarise(reps, labeled.qrels) for reps in levels.values()]
    result["components"] = components.get("components", {})
    return result


async def empty_level(client: Any, concurrency: int, n: int) -> dict[str, Any]:
    """``GET /healthz`` (no credential, no backend): what a request costs through the HTTP
    front, Serve's replica and FastAPI before the gateway does anything."""

    async def call(_: int) -> None:
        resp = await client.get("/healthz")
        if resp.status_code != 200:
            raise RuntimeError(f"/healthz answered {resp.status_code}")

    wall, latencies, _, errors = await closed_loop(list(range(n)), concurrency, call)
    summary = latency_summary(latencies)
    return {
        "concurrency": concurrency,
        "errors": len(errors),
        "requests_per_s": round(len(latencies) / wall, 2),
        "p50_ms": summary.get("p50_ms"),
        "p95_ms": summary.get("p95_ms"),
    }


def auth(tok: str) -> dict[str, str]:
    return {"authorization": f"Bearer {tok}"}


async def warm_up(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    queries: list[tuple[str, str]],
    tokens: list[str],
    chunks: int,
) -> None:
    """Search until the in-memory index answers with every chunk, then 30 more. With
    several Ingress replicas (each holds its own index; the HTTP front spreads requests by
    connection) eight searches go at once, and every replica's state must show it loaded:
    ``/readyz`` is asked on fresh connections until 3 × the replicas in a row say so."""
    t0 = time.perf_counter()
    extra, width = 0, 8 if (args.ingress_replicas or 1) > 1 else 1
    needed = 3 * (args.ingress_replicas or 1)
    for i in range(100_000):
        bodies = [
            search_body(args, queries[(i * width + j) % len(queries)][1], "hybrid")
            for j in range(width)
        ]
        answers = await asyncio.gather(
            *(client.post("/rag/search_docs", json=b, headers=auth(tokens[0])) for b in bodies)
        )
        for resp in answers:
            resp.raise_for_status()
        states = []
        for _ in range(needed if width > 1 else 1):
            async with httpx.AsyncClient(base_url=client.base_url, timeout=30.0) as fresh:
                states.append(await memory_state(fresh if width > 1 else client, tokens[0]))
        if all(
            not s.get("enabled") or (s.get("chunks") == chunks and not s["loading"]) for s in states
        ):
            extra += 1
            if extra >= 30:
                break
        else:
            await asyncio.sleep(0.2)
    state = await memory_state(client, tokens[0])
    logger.info("warm after %.1f s: %s", time.perf_counter() - t0, state)


async def memory_state(client: httpx.AsyncClient, tok: str) -> dict[str, Any]:
    body = (await client.get("/readyz", headers=auth(tok))).json()
    return body.get("components", {}).get("milvus", {}).get("memory_index", {})


def log_level(rep: int, res: dict[str, Any]) -> None:
    lat, cpu = res["latency"], res["cpu_ms_per_request"]
    logger.info(
        "rep %d %s c=%d: p50 %s ms, p95 %s ms, %.1f req/s, %d errors, %d cache hits, "
        "CPU ms/request %s",
        rep + 1,
        res["path"],
        res["concurrency"],
        lat.get("p50_ms"),
        lat.get("p95_ms"),
        res["requests_per_s"],
        res["errors"],
        res["cache_hits"],
        cpu,
    )


# --- the peer -------------------------------------------------------------------------------
def peer_wanted(args: argparse.Namespace) -> bool:
    if args.peer == "off":
        return False
    if PEER_PYTHON.exists():
        return True
    if args.peer == "on":
        raise SystemExit(f"--peer on: {PEER_PYTHON} is missing (bench/peer_haystack.py)")
    logger.info("no Haystack peer: %s is missing (bench/peer_haystack.py)", PEER_PYTHON)
    return False


def peer(args: argparse.Namespace, settings: Any) -> dict[str, Any]:
    """The Haystack hybrid service on the same chunks and queries, c=1 and c=8."""
    labeled, chunks, queries = corpus(args, settings)
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        path = Path(tmp) / "chunks.jsonl"
        with path.open("w") as f:
            for c in chunks:
                row = {"id": c.chunk_id, "doc_id": c.doc_id, "text": c.text, "vector": c.vector}
                f.write(json.dumps(row) + "\n")
        port = args.port + 90
        cmd = [str(PEER_PYTHON), "-m", "bench.peer_haystack_search", "--chunks", str(path)]
        cmd += ["--port", str(port), "--collection", "bench_peer_search"]
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line.startswith("READY"):
                raise RuntimeError(f"the peer did not start: {line!r}")
            index_s = float(line.split()[3])
            logger.info("peer ready: %s", line.strip())
            levels = asyncio.run(peer_levels(args, port, queries, labeled.qrels))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return {"chunks": len(chunks), "index_s": index_s, "levels": levels}


async def peer_levels(
    args: argparse.Namespace, port: int, queries: list[tuple[str, str]], qrels: dict
) -> list[dict[str, Any]]:
    text = dict(queries)
    out = []
    base = f"http://127.0.0.1:{port}"
    async with open_client(args.client, base, 300.0, max(args.concurrency) + 4) as client:
        for _, query in queries[:10]:  # warm-up
            resp = await client.post("/search", json={"query": query, "top_k": args.top_k})
            resp.raise_for_status()
        by_c: dict[int, list[dict[str, Any]]] = {}
        for rep in range(args.peer_reps):
            for c, n in zip(args.concurrency, args.requests, strict=True):
                runs: dict[str, list[str]] = {}

                async def call(qid: str, runs: dict[str, list[str]] = runs) -> None:
                    resp = await client.post(
                        "/search", json={"query": text[qid], "top_k": args.top_k}
                    )
                    resp.raise_for_status()
                    runs[qid] = distinct(resp.json()["doc_ids"])

                before = cpu_by_process()
                wall, latencies, _, errors = await closed_loop([q for q, _ in queries[:n]], c, call)
                res = {
                    "path": "peer",
                    "concurrency": c,
                    "requests": n,
                    "errors": len(errors),
                    "cache_hits": 0,
                    "requests_per_s": round(len(latencies) / wall, 2),
                    "latency": latency_summary(latencies),
                    "server_took_p50_ms": None,
                    "stages_p50_ms": {},
                    "cpu_ms_per_request": cpu_ms_per_request(
                        before, cpu_by_process(), len(latencies)
                    ),
                    "runs": runs,
                }
                log_level(rep, res)
                by_c.setdefault(c, []).append(res)
        out = [summarise(reps, qrels) for reps in by_c.values()]
    return out


# --- the report -----------------------------------------------------------------------------
def render(result: dict[str, Any]) -> str:
    gw = result.get("gateway", {})
    fl = gw.get("floor", {})
    peer_levels = {lv["concurrency"]: lv for lv in result.get("peer", {}).get("levels", [])}
    client = result.get("args", {}).get("client", "httpx")
    rows = []
    for path in ("hybrid", "dense", "bm25"):
        if path in fl:
            rows.append([f"floor, {path}", "", fl[path], "", "", "", "", "", ""])
    for lv in gw.get("empty", []):
        rows.append(
            [
                f"empty request (GET /healthz), {client}",
                lv["concurrency"],
                lv["p50_ms"],
                lv["p95_ms"],
                lv["requests_per_s"],
                "",
                "",
                f"{lv['errors']} / 0",
                "",
            ]
        )
    for lv in gw.get("levels", []):
        base = fl.get(lv["path"] if lv["path"] != "cached" else "hybrid")
        ratio = f"{lv['p50_ms'] / base:.2f}×" if base and lv["concurrency"] == 1 else ""
        near = lv.get("p50_over_floor_beside")
        if ratio and near is not None:
            ratio += f" (beside {near:.2f}×)"
        peer_lv = peer_levels.get(lv["concurrency"])
        vs_peer = ""
        if peer_lv and lv["path"] in ("hybrid", "cached"):
            vs_peer = f"{lv['requests_per_s'] / peer_lv['requests_per_s']:.2f}× req/s, " + (
                f"{peer_lv['p50_ms'] / lv['p50_ms']:.2f}× p50"
            )
        rows.append(
            [
                f"gateway, {lv['path']}",
                lv["concurrency"],
                lv["p50_ms"],
                lv["p95_ms"],
                lv["requests_per_s"],
                ratio,
                vs_peer,
                f"{lv['errors']} / {lv['cache_hits']}",
                lv["ndcg@10"],
            ]
        )
    for lv in peer_levels.values():
        rows.append(
            [
                "Haystack peer, hybrid",
                lv["concurrency"],
                lv["p50_ms"],
                lv["p95_ms"],
                lv["requests_per_s"],
                "",
                "1.00×",
                f"{lv['errors']} / 0",
                lv["ndcg@10"],
            ]
        )
    head = [
        "path",
        "c",
        "p50 ms",
        "p95 ms",
        "req/s",
        "p50 / floor (the floor beside the level)",
        "vs peer",
        "errors / cache hits",
        "nDCG@10",
    ]
    table = markdown_table(head, rows)
    roles = ["proxy", "ingress", "embedder", "retriever", "milvus", "client", "ray", "peer"]
    cpu_rows = []
    for lv in [*gw.get("levels", []), *peer_levels.values()]:
        cpu = lv["cpu_ms_per_request"]
        cpu_rows.append(
            [lv["path"], lv["concurrency"], cpu.get("total", 0)]
            + [cpu.get(r, 0.0) for r in roles]
            + [", ".join(f"{k} {v}" for k, v in lv["stages_p50_ms"].items())]
        )
    cpu_table = markdown_table(
        ["path", "c", "CPU ms/req", *roles, "server stages p50 ms"], cpu_rows
    )
    spy_rows = []
    for lv in gw.get("levels", []):
        for role, prof in (lv.get("profiles") or {}).items():
            if prof.get("samples"):
                kinds = ", ".join(f"{k} {v}" for k, v in list(prof["kinds_pct"].items())[:6])
                spy_rows.append(
                    [
                        lv["path"],
                        lv["concurrency"],
                        role,
                        prof["samples"],
                        kinds,
                        prof["gateway_on_stack_pct"],
                    ]
                )
    if not spy_rows:
        return table + "\n\n" + cpu_table
    spy_table = markdown_table(
        ["path", "c", "process", "samples", "leaf code % (top 6)", "gateway on stack %"],
        spy_rows,
    )
    return table + "\n\n" + cpu_table + "\n\n" + spy_table


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    for item in args.serve_env:
        name, _, value = item.partition("=")
        os.environ[name] = value
    settings: dict[str, Any] = {
        "auth": {"mode": "jwt", "hs256_secret": SECRET},
        "cache": {"enabled": True},
    }
    for item in args.setting:
        settings = deep_merge(settings, json.loads(item))
    harness = ServeHarness(
        port=args.port,
        collection=args.collection,
        settings=settings,
        ingress_replicas=args.ingress_replicas,
    )
    result: dict[str, Any] = {
        "benchmark": "plumbing",
        "args": vars(args),
        "environment": environment_info(),
        "serve_env": {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")},
        "embedder": harness.settings.embedder.embed_model_tag,
    }
    if peer_wanted(args):
        result["peer"] = peer(args, harness.settings)

    async def run(h: ServeHarness) -> dict[str, Any]:
        return {"gateway": await gateway(args, h)}

    run_benchmark("plumbing", harness, result, run, render, args.out)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
