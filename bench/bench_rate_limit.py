"""What a rate limit costs per request: ``RateLimiter.admit`` alone (credential + one team,
in memory and in a real Redis), and a whole search request with limits on vs. off through
the in-process app over fakes (the same requests, interleaved in rounds, medians).

    python -m bench.bench_rate_limit [--redis-url redis://127.0.0.1:6380/0] [--rounds 5]

Writes ``bench/results/rate_limit-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from bench.common import environment_info, setup_logging, write_result
from serve_app.http.rate_limits import RateLimiter
from serve_app.settings import RateLimitSettings
from serve_app.testing import build_gateway, mint

# Limits no request reaches: the cost of checking them, never a refusal.
HIGH = {
    "per_credential_per_s": 1e6,
    "per_credential_burst": 10**7,
    "per_team_per_s": 1e6,
    "per_team_burst": 10**7,
}


async def admit_cost(limiter: RateLimiter, n: int) -> dict[str, float]:
    """Microseconds per ``admit`` (credential + one team), median of 5 blocks of n/5."""
    blocks = []
    for _ in range(5):
        started = time.perf_counter()
        for i in range(n // 5):
            await limiter.admit(f"cred{i % 50}", [f"team{i % 5}"])
        blocks.append((time.perf_counter() - started) / (n // 5) * 1e6)
    return {"median_us": round(statistics.median(blocks), 1), "blocks_us": blocks}


def search_cost(rounds: int, per_round: int) -> dict[str, Any]:
    """Median ms per search request through the app (fakes), limits on vs. off."""
    docs = [
        {"team_id": "dao_greenfood", "doc_id": f"d{i}", "text": f"Milvus note {i} on pumps."}
        for i in range(50)
    ]
    gateways = {
        "on": build_gateway(corpus=docs, rate_limit=HIGH),
        "off": build_gateway(corpus=docs, rate_limit={"enabled": False}),
    }
    headers = {"authorization": f"Bearer {mint()}"}
    body = {"team_id": "dao_greenfood", "query": "milvus pumps", "top_k": 5}
    times: dict[str, list[float]] = {"on": [], "off": []}
    for gw in gateways.values():  # warm-up
        for _ in range(20):
            gw.client.post("/rag/search_docs", json=body, headers=headers)
    for _ in range(rounds):
        for name, gw in gateways.items():
            started = time.perf_counter()
            for _ in range(per_round):
                r = gw.client.post("/rag/search_docs", json=body, headers=headers)
                assert r.status_code == 200, r.text
            times[name].append((time.perf_counter() - started) / per_round * 1000)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    return {
        "on_ms": round(on, 3),
        "off_ms": round(off, 3),
        "ratio": round(on / off, 3),
        "extra_us": round((on - off) * 1000, 1),
        "rounds_ms": times,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="", help="also measure buckets in this Redis")
    p.add_argument("--n", type=int, default=20_000, help="admits per backend")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=200)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    setup_logging()
    result: dict[str, Any] = {}
    memory = RateLimiter(RateLimitSettings(**HIGH))
    result["admit_memory"] = asyncio.run(admit_cost(memory, args.n))
    print(f"admit, memory: {result['admit_memory']['median_us']} µs")
    if args.redis_url:
        prefix = f"rag:bench:rl:{uuid.uuid4().hex[:8]}:"

        async def redis_run() -> dict[str, float]:
            limiter = RateLimiter.from_settings(
                RateLimitSettings(
                    backend="redis", redis_url=args.redis_url, redis_prefix=prefix, **HIGH
                ),
                "memory",
                "",
            )
            try:
                return await admit_cost(limiter, max(1000, args.n // 10))
            finally:
                async for key in limiter.redis.scan_iter(match=prefix + "*"):
                    await limiter.redis.delete(key)
                await limiter.close()

        result["admit_redis"] = asyncio.run(redis_run())
        print(f"admit, Redis: {result['admit_redis']['median_us']} µs")
    result["search"] = search_cost(args.rounds, args.per_round)
    s = result["search"]
    print(f"search through the app: on {s['on_ms']} ms, off {s['off_ms']} ms ({s['ratio']}×)")
    result["environment"] = environment_info()
    print(f"wrote {write_result('rate_limit', result, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
