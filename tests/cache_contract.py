"""The contract every semantic-cache store keeps (serve_app/search/cache/protocol.py), written once
as async checks that take a store and a clock:
tests/unit/serve_app/search/cache/test_cache_store.py runs them on MemoryCacheStore with a fake
clock, tests/integration/test_cache_redis.py on RedisCacheStore against the real Redis, with
real (short) ttls.

Each check gets a fresh, empty store built with ``max_per_bucket=MAX_PER_BUCKET``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import numpy as np

from serve_app.search.cache.protocol import CacheStore

MAX_PER_BUCKET = 4
DIM = 16
LONG_TTL_S = 600.0


class Clock(Protocol):
    # A ttl the clock can outwait quickly (fake: any; real: well under a second).
    short_ttl_s: float
    # Seconds an age may differ from the time advanced (0 for a fake clock).
    slack_s: float

    async def advance(self, seconds: float) -> None: ...


class FakeClock:
    """A monotonic clock the test moves (MemoryCacheStore(clock=...))."""

    short_ttl_s = 10.0
    slack_s = 0.0

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def advance(self, seconds: float) -> None:
        self.now += seconds


class RealClock:
    """Real time, for a store whose expiry is kept by its server."""

    short_ttl_s = 0.5
    slack_s = 0.05

    async def advance(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def unit(seed: int) -> list[float]:
    v = np.random.default_rng(seed).standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def near(vector: list[float], cosine: float, seed: int = 99) -> list[float]:
    """A unit vector whose cosine with ``vector`` (unit) is exactly ``cosine``."""
    v = np.asarray(vector)
    other = np.random.default_rng(seed).standard_normal(DIM)
    other -= other.dot(v) * v
    other /= np.linalg.norm(other)
    return (cosine * v + np.sqrt(1 - cosine**2) * other).tolist()


async def check_exact_hit(store: CacheStore, clock: Clock) -> None:
    value = b"\x00answer\xff" * 10
    await store.put("b1", "q:hello", unit(1), value, LONG_TTL_S)
    hit = await store.get("b1", "q:hello")
    assert hit is not None
    assert hit.value == value and hit.similarity == 1.0
    assert 0.0 <= hit.age_s < 5.0
    assert await store.get("b1", "q:other") is None
    assert await store.get("b2", "q:hello") is None
    # A re-put replaces the value.
    await store.put("b1", "q:hello", unit(1), b"second", LONG_TTL_S)
    hit = await store.get("b1", "q:hello")
    assert hit is not None and hit.value == b"second"
    near_hit = await store.nearest("b1", unit(1), 0.99)
    assert near_hit is not None and near_hit.value == b"second"


async def check_near_duplicate(store: CacheStore, clock: Clock) -> None:
    base = unit(2)
    await store.put("b", "k", base, b"base", LONG_TTL_S)
    hit = await store.nearest("b", near(base, 0.97), 0.95)
    assert hit is not None and hit.value == b"base"
    assert abs(hit.similarity - 0.97) < 1e-4
    assert await store.nearest("b", near(base, 0.90), 0.95) is None
    # Identical vectors match even at threshold 1.0; an unnormalised query is normalised.
    same = await store.nearest("b", base, 1.0)
    assert same is not None and same.value == b"base" and same.similarity <= 1.0
    scaled = await store.nearest("b", [3.0 * x for x in base], 0.999)
    assert scaled is not None and scaled.value == b"base"
    # The closest of several wins, whatever the order they were stored in.
    await store.put("c", "k2", near(base, 0.96, seed=5), b"far", LONG_TTL_S)
    await store.put("c", "k3", near(base, 0.99, seed=6), b"close", LONG_TTL_S)
    await store.put("c", "k4", near(base, 0.97, seed=7), b"farther", LONG_TTL_S)
    best = await store.nearest("c", base, 0.95)
    assert best is not None and best.value == b"close"
    assert abs(best.similarity - 0.99) < 1e-4


async def check_tie_goes_to_most_recent(store: CacheStore, clock: Clock) -> None:
    v = unit(3)
    await store.put("b", "older", v, b"older", LONG_TTL_S)
    await store.put("b", "newer", v, b"newer", LONG_TTL_S)
    hit = await store.nearest("b", v, 0.95)
    assert hit is not None and hit.value == b"newer"
    # Re-storing the older one makes it the most recent.
    await store.put("b", "older", v, b"older again", LONG_TTL_S)
    hit = await store.nearest("b", v, 0.95)
    assert hit is not None and hit.value == b"older again"


async def check_vectorless_entries(store: CacheStore, clock: Clock) -> None:
    await store.put("b", "zero", [0.0] * DIM, b"zero", LONG_TTL_S)
    await store.put("b", "none", None, b"none", LONG_TTL_S)
    await store.put("b", "nan", [float("nan")] * DIM, b"nan", LONG_TTL_S)
    for key in ("zero", "none", "nan"):
        hit = await store.get("b", key)
        assert hit is not None and hit.value == key.encode()
    assert await store.nearest("b", unit(4), 0.5) is None
    await store.put("b", "real", unit(4), b"real", LONG_TTL_S)
    assert await store.nearest("b", [0.0] * DIM, 0.5) is None  # a zero query never matches
    assert await store.nearest("b", [], 0.5) is None
    # A vector of another dimension never matches (nor breaks the scan).
    assert await store.nearest("b", unit(4)[:8], 0.5) is None
    hit = await store.nearest("b", unit(4), 0.99)
    assert hit is not None and hit.value == b"real"


async def check_ttl(store: CacheStore, clock: Clock) -> None:
    v = unit(5)
    short = clock.short_ttl_s
    await store.put("b", "short", v, b"short", short)
    await store.put("b", "long", near(v, 0.96), b"long", LONG_TTL_S)
    hit = await store.nearest("b", v, 0.95)
    assert hit is not None and hit.value == b"short"
    assert (await store.get("b", "short")) is not None
    waited = short * 1.5
    await clock.advance(waited)
    assert await store.get("b", "short") is None
    # The expired entry is the closer one, but only the live one answers.
    hit = await store.nearest("b", v, 0.95)
    assert hit is not None and hit.value == b"long"
    assert hit.age_s >= waited - clock.slack_s
    again = await store.get("b", "long")
    assert again is not None and again.age_s >= waited - clock.slack_s
    # A ttl that is not positive stores nothing, and drops what was there.
    await store.put("b", "long", v, b"gone", 0)
    assert await store.get("b", "long") is None
    assert await store.nearest("b", v, 0.5) is None


async def check_per_bucket_cap(store: CacheStore, clock: Clock) -> None:
    await store.put("other", "keep", unit(50), b"other", LONG_TTL_S)
    for i in range(MAX_PER_BUCKET):
        await store.put("b", f"k{i}", unit(60 + i), f"v{i}".encode(), LONG_TTL_S)
        await clock.advance(0.001)
    for i in range(MAX_PER_BUCKET):
        assert await store.get("b", f"k{i}") is not None
    # Re-storing k0 makes it the newest: the next put drops k1, the oldest.
    await store.put("b", "k0", unit(60), b"v0", LONG_TTL_S)
    await clock.advance(0.001)
    await store.put("b", "new", unit(70), b"new", LONG_TTL_S)
    assert await store.get("b", "k1") is None
    hit = await store.nearest("b", unit(61), 0.99)
    assert hit is None
    for key in ("k0", "k2", "k3", "new"):
        assert await store.get("b", key) is not None, key
    # Other buckets keep theirs.
    kept = await store.get("other", "keep")
    assert kept is not None and kept.value == b"other"


async def check_buckets_isolated(store: CacheStore, clock: Clock) -> None:
    v = unit(7)
    await store.put("team-a", "q", v, b"a", LONG_TTL_S)
    assert await store.get("team-b", "q") is None
    assert await store.nearest("team-b", v, 0.5) is None
    await store.put("team-b", "q2", near(v, 0.999), b"b", LONG_TTL_S)
    hit = await store.nearest("team-a", near(v, 0.999), 0.5)
    assert hit is not None and hit.value == b"a"
    hit = await store.nearest("team-b", v, 0.5)
    assert hit is not None and hit.value == b"b"
    # Separators inside bucket or key names never make two entries collide.
    await store.put("x:y", "z", None, b"bucket x:y", LONG_TTL_S)
    await store.put("x", "y:z", None, b"bucket x", LONG_TTL_S)
    first, second = await store.get("x:y", "z"), await store.get("x", "y:z")
    assert first is not None and first.value == b"bucket x:y"
    assert second is not None and second.value == b"bucket x"
    assert await store.get("x:y:z", "") is None


async def check_clear(store: CacheStore, clock: Clock) -> None:
    await store.put("b1", "k1", unit(8), b"1", LONG_TTL_S)
    await store.put("b1", "k2", unit(9), b"2", LONG_TTL_S)
    await store.put("b2", "k1", unit(8), b"3", LONG_TTL_S)
    assert await store.clear() == 3
    assert await store.get("b1", "k1") is None
    assert await store.get("b2", "k1") is None
    assert await store.nearest("b1", unit(8), 0.5) is None
    assert await store.clear() == 0
    await store.put("b1", "k1", unit(8), b"after", LONG_TTL_S)
    hit = await store.get("b1", "k1")
    assert hit is not None and hit.value == b"after"


async def check_stored_query_and_accept(store: CacheStore, clock: Clock) -> None:
    """Each entry keeps the query it was stored with; ``nearest`` reports it and asks
    ``accept`` about the candidates from the closest down (issue 38, item 7)."""
    base = unit(11)
    await store.put("b", "far", near(base, 0.96, seed=1), b"far", LONG_TTL_S, "far query")
    await store.put("b", "close", near(base, 0.99, seed=2), b"close", LONG_TTL_S, "close query")
    await store.put("b", "old", near(base, 0.98, seed=3), b"old", LONG_TTL_S)  # no query
    await store.put("b", "distant", near(base, 0.5, seed=4), b"d", LONG_TTL_S, "distant")
    hit = await store.nearest("b", base, 0.95)
    assert hit is not None and hit.value == b"close" and hit.query == "close query"
    asked: list[str | None] = []

    def only_far(query: str | None) -> bool:
        asked.append(query)
        return query == "far query"

    hit = await store.nearest("b", base, 0.95, only_far)
    assert hit is not None and hit.value == b"far" and hit.query == "far query"
    assert abs(hit.similarity - 0.96) < 1e-4
    # Closest first; an entry stored without a query is reported as None; below the
    # threshold nothing is asked.
    assert asked == ["close query", None, "far query"]
    asked.clear()
    assert await store.nearest("b", base, 0.95, lambda q: asked.append(q) is not None) is None
    assert asked == ["close query", None, "far query"]
    old = await store.nearest("b", base, 0.95, lambda q: q is None)
    assert old is not None and old.value == b"old" and old.query is None
    # A query in any script round-trips; a re-put replaces it.
    await store.put("b", "close", near(base, 0.99, seed=2), b"v2", LONG_TTL_S, "файл ✓ 3.10")
    hit = await store.nearest("b", base, 0.95)
    assert hit is not None and hit.value == b"v2" and hit.query == "файл ✓ 3.10"
    # A vector of another dimension never matches, with or without a stored query.
    assert await store.nearest("b", base[:8], 0.5, lambda q: True) is None


async def check_status(store: CacheStore, clock: Clock) -> None:
    status = await store.status()
    assert status["backend"] in ("memory", "redis")
    assert status["ready"] is True


Check = Callable[[CacheStore, Clock], Awaitable[None]]
CHECKS: list[Check] = [
    check_exact_hit,
    check_near_duplicate,
    check_tie_goes_to_most_recent,
    check_vectorless_entries,
    check_ttl,
    check_per_bucket_cap,
    check_buckets_isolated,
    check_clear,
    check_stored_query_and_accept,
    check_status,
]
