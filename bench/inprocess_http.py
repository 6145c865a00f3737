"""The gateway's app behind a plain uvicorn server, a client in another process
(``bench_inprocess --what http``): what the HTTP legs of a search cost without Ray Serve or
HAProxy, each client against the same server.

The app is ``inprocess_app.build_app``'s (the Ingress's app over the same chunks, model,
JWT auth and state database); uvicorn runs it as Serve's replicas do (``http`` and
``loop`` auto: httptools, uvloop when installed). Each pass starts a client process
(``python -m bench.inprocess_http CLIENT_ARGS``) with one of ``bench/http_clients.py``'s
clients, which sends ``GET /healthz`` 200 times and then each query once (a pass's queries
carry its own suffix, so no pass answers from another's cache entries), ``--gap-ms``
apart, and reports the p50 of the empty request, of the search, of its ``Server-Timing``
``app`` (the app from its outermost middleware to the response's start) and of the
search's time outside the app (round trip minus ``app``, per request). Passes alternate the
clients: ``httpx, aiohttp`` × ``--rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_search_real import parse_server_timing
from bench.http_clients import CLIENTS, open_client

EMPTY_REQUESTS = 200
EMPTY_WARMUP = 50


def bench_http(args: argparse.Namespace, port: int = 8411) -> dict[str, Any]:
    """Per pass: the client and its p50s (ms): ``empty``, ``search``, ``app``, ``outside``."""
    import uvicorn

    from bench.inprocess_app import build_app

    built = build_app(args)
    folder = Path(tempfile.mkdtemp(prefix="bench_http_"))

    async def passes() -> list[dict[str, Any]]:
        built.embedder.start_loading()
        config = uvicorn.Config(
            built.app, host="127.0.0.1", port=port, log_level="warning", access_log=False
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        out = []
        try:
            for n in range(args.rounds):
                for kind in CLIENTS:
                    queries = folder / "queries.json"
                    suffix = f" {kind}{n}"
                    queries.write_text(json.dumps([q + suffix for _, q in built.queries]))
                    out.append(await _client_pass(kind, port, built.token, queries, args))
        finally:
            server.should_exit = True
            await serving
        return out

    return {"passes": asyncio.run(passes())}


async def _client_pass(
    kind: str, port: int, token: str, queries: Path, args: argparse.Namespace
) -> dict[str, Any]:
    argv = [str(port), token, str(queries), kind, args.team, str(args.top_k), str(args.gap_ms)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.inprocess_http", *argv, stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the {kind} client exited {proc.returncode}")
    result: dict[str, Any] = json.loads(stdout)
    return result


async def _client(argv: list[str]) -> dict[str, Any]:
    port, token, queries_file, kind, team, top_k, gap_ms = argv
    queries = json.loads(Path(queries_file).read_text())
    gap = float(gap_ms) / 1000
    headers = {"authorization": f"Bearer {token}"}
    empty: list[float] = []
    took: list[float] = []
    app: list[float] = []
    async with open_client(kind, f"http://127.0.0.1:{port}", 60.0, 4) as client:
        for _ in range(EMPTY_REQUESTS):
            started = time.perf_counter()
            (await client.get("/healthz")).raise_for_status()
            empty.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(gap)
        for query in queries:
            body = {"team_id": team, "query": query, "top_k": int(top_k)}
            started = time.perf_counter()
            answer = await client.post("/rag/search_docs", json=body, headers=headers)
            answer.json()
            took.append((time.perf_counter() - started) * 1000)
            answer.raise_for_status()
            app.append(parse_server_timing(answer.headers["server-timing"])["app"])
            await asyncio.sleep(gap)
    median = statistics.median
    return {
        "client": kind,
        "empty_p50_ms": round(median(empty[EMPTY_WARMUP:]), 3),
        "search_p50_ms": round(median(took), 3),
        "app_p50_ms": round(median(app), 3),
        "outside_p50_ms": round(median(t - a for t, a in zip(took, app, strict=True)), 3),
    }


if __name__ == "__main__":
    sys.stdout.write(json.dumps(asyncio.run(_client(sys.argv[1:]))))
