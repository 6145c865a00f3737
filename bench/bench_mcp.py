"""One search two ways against a running gateway: ``POST /tools/rag_search_docs`` (plain
HTTP) and the MCP server at ``/mcp`` (the SDK's ``Client.call_tool`` over Streamable HTTP).

The queries are the AppStream summaries of ``bench.realtext`` (the ``bench_search_real``
set, in its fixed order); the team should hold the AppStream documents (``bench_search_real``
writes them), though any text will do: the same search runs both ways, which is the point.
Calls are sequential and interleaved (HTTP then MCP for one pair, MCP then HTTP for the next)
so drift of the machine hits both alike. Every measured call has a query of its own, so the
semantic cache does not answer the second path of a pair (its hits are counted anyway); the
warm-up sends each query both ways and counts the answers that differ. Both paths use one
keep-alive ``httpx2`` client each, so the difference is the MCP layer (JSON-RPC framing, the
SDK's client and server, its output-schema validation). Reports client p50/p95 per path,
their ratio, and the gateway's own time (``Server-Timing: app``) per path.

    .venv/bin/python -m bench.bench_mcp --url http://127.0.0.1:8000 --token "$TOKEN" --n 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench import realtext
from bench.common import (
    environment_info,
    latency_summary,
    markdown_table,
    setup_logging,
    write_result,
)

logger = logging.getLogger("bench.mcp")
TOOL = "rag_search_docs"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_mcp",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway's base URL")
    p.add_argument("--token", default="", help="bearer JWT or API key (none: dev mode)")
    p.add_argument("--team", default="", help="X-Team-Id (when the credential grants several)")
    p.add_argument("--n", type=int, default=200, help="calls per path")
    p.add_argument("--warmup", type=int, default=10, help="calls per path before measuring")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--mode", default="auto", help="MCP client mode: auto (2026-07-28) or legacy")
    p.add_argument("--out", default=None, help="JSON result path (default bench/results/)")
    p.add_argument("--no-write", action="store_true", help="print only, no result file")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def queries(n: int) -> list[str]:
    """The first ``n`` AppStream summaries (repeated when ``n`` is larger than the set: then
    the semantic cache answers the repeats)."""
    labeled = realtext.appstream("bench_mcp")
    texts = [labeled.queries[q] for q in sorted(labeled.queries)]
    return [texts[i % len(texts)] for i in range(n)]


def app_ms(response: httpx2.Response) -> float | None:
    """The ``app`` stage of the response's ``Server-Timing`` header, in milliseconds."""
    for part in response.headers.get("server-timing", "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name == "app" and dur:
            return float(dur)
    return None


class Paths:
    """The two ways to call the tool, each timing the client and the gateway's own share."""

    def __init__(self, http: httpx2.AsyncClient, mcp: Client, top_k: int) -> None:
        self.http, self.mcp, self.top_k = http, mcp, top_k
        self.server_ms: list[float] = []  # filled by the MCP client's response hook

    async def via_http(self, query: str) -> Call:
        started = time.perf_counter()
        r = await self.http.post(f"/tools/{TOOL}", json={"query": query, "top_k": self.top_k})
        took = time.perf_counter() - started
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        return Call.of(took, app_ms(r), r.json())

    async def via_mcp(self, query: str) -> Call:
        self.server_ms.clear()
        started = time.perf_counter()
        result = await self.mcp.call_tool(TOOL, {"query": query, "top_k": self.top_k})
        took = time.perf_counter() - started
        if result.is_error:
            raise RuntimeError(f"MCP tool error: {result.content[0].text[:300]}")
        server = sum(self.server_ms) if self.server_ms else None
        return Call.of(took, server, result.structured_content or {})


@dataclass(frozen=True)
class Call:
    seconds: float
    server_ms: float | None
    chunk_ids: list[str]
    cache_hit: bool

    @classmethod
    def of(cls, seconds: float, server_ms: float | None, body: dict[str, Any]) -> Call:
        ids = [m["chunk_id"] for m in body.get("matches", [])]
        return cls(seconds, server_ms, ids, bool((body.get("cache") or {}).get("hit")))


@asynccontextmanager
async def connected(args: argparse.Namespace) -> AsyncIterator[Paths]:
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    if args.team:
        headers["x-team-id"] = args.team
    base = args.url.rstrip("/")
    timeout = httpx2.Timeout(30.0, read=120.0)
    paths: Paths | None = None

    async def on_response(response: httpx2.Response) -> None:
        ms = app_ms(response)
        if paths is not None and ms is not None:
            paths.server_ms.append(ms)

    http = httpx2.AsyncClient(base_url=base, headers=headers, timeout=timeout)
    mcp_http = httpx2.AsyncClient(
        headers=headers, timeout=timeout, event_hooks={"response": [on_response]}
    )
    # cache=None: every call reaches the gateway (tools/call is not cacheable anyway).
    client = Client(
        streamable_http_client(f"{base}/mcp", http_client=mcp_http), mode=args.mode, cache=None
    )
    async with http, mcp_http, client:
        logger.info("MCP connected: protocol %s", client.protocol_version)
        paths = Paths(http, client, args.top_k)
        yield paths


async def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = queries(args.warmup + 2 * args.n)
    warm, measured = texts[: args.warmup], texts[args.warmup :]
    samples: dict[str, dict[str, list[float]]] = {
        "http": {"client": [], "server": []},
        "mcp": {"client": [], "server": []},
    }
    hits = {"http": 0, "mcp": 0}
    differ = 0
    async with connected(args) as paths:
        calls = {"http": paths.via_http, "mcp": paths.via_mcp}
        for query in warm:  # both ways with the same query: the answers must agree
            a, b = await paths.via_http(query), await paths.via_mcp(query)
            differ += a.chunk_ids != b.chunk_ids
        for i in range(args.n):
            order = ("http", "mcp") if i % 2 == 0 else ("mcp", "http")
            for j, name in enumerate(order):
                call = await calls[name](measured[2 * i + j])
                samples[name]["client"].append(call.seconds)
                if call.server_ms is not None:
                    samples[name]["server"].append(call.server_ms / 1000)
                hits[name] += call.cache_hit
            if (i + 1) % 50 == 0:
                logger.info("%d/%d pairs", i + 1, args.n)
        protocol = paths.mcp.protocol_version
    summary = {
        name: {"client": latency_summary(s["client"]), "server": latency_summary(s["server"])}
        for name, s in samples.items()
    }
    ratio = {
        p: round(summary["mcp"]["client"][f"{p}_ms"] / summary["http"]["client"][f"{p}_ms"], 3)
        for p in ("p50", "p95")
    }
    return {
        "args": {k: v for k, v in vars(args).items() if k != "token"},
        "environment": environment_info(),
        "mcp_protocol": protocol,
        "warmup_answers_differ": differ,
        "cache_hits": hits,
        "summary": summary,
        "ratio_mcp_over_http": ratio,
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    for name in ("http", "mcp"):
        c, s = result["summary"][name]["client"], result["summary"][name]["server"]
        rows.append(
            [
                name,
                c["n"],
                c["p50_ms"],
                c["p95_ms"],
                s.get("p50_ms", "-"),
                s.get("p95_ms", "-"),
            ]
        )
    ratio = result["ratio_mcp_over_http"]
    rows.append(["mcp / http", "", ratio["p50"], ratio["p95"], "", ""])
    table = markdown_table(
        ["path", "n", "client p50 ms", "client p95 ms", "app p50 ms", "app p95 ms"], rows
    )
    return (
        f"{TOOL}: plain HTTP vs MCP ({result['mcp_protocol']}), top_k {result['args']['top_k']}; "
        f"warm-up answers that differ: {result['warmup_answers_differ']}; cache hits: "
        f"{result['cache_hits']}\n\n{table}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if not args.verbose:  # one INFO line per request otherwise
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    result = asyncio.run(run(args))
    if not args.no_write:
        write_result("bench_mcp", result, args.out)
    else:
        logger.debug("%s", json.dumps(result, indent=2))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
