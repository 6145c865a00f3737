"""MemoryCacheStore against the shared store contract (tests/cache_contract.py), with a fake
clock, plus what only the in-process store has: the global LRU cap and lazy expiry; and
build_store / redact_url (no Redis needed: a RedisCacheStore connects on first use)."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.search.cache.store import (
    MemoryCacheStore,
    RedisCacheStore,
    _winners,
    build_store,
    redact_url,
)
from serve_app.settings import CacheSettings
from tests.cache_contract import CHECKS, LONG_TTL_S, MAX_PER_BUCKET, Check, FakeClock, unit


def memory_store(clock: FakeClock, max_entries: int = 10_000) -> MemoryCacheStore:
    return MemoryCacheStore(max_entries=max_entries, max_per_bucket=MAX_PER_BUCKET, clock=clock)


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_contract(check: Check) -> None:
    clock = FakeClock()
    await check(memory_store(clock), clock)


async def test_global_cap_drops_least_recently_used_across_buckets() -> None:
    store = memory_store(FakeClock(), max_entries=3)
    await store.put("b1", "a", unit(1), b"a", LONG_TTL_S)
    await store.put("b2", "b", unit(2), b"b", LONG_TTL_S)
    await store.put("b3", "c", unit(3), b"c", LONG_TTL_S)
    assert await store.get("b1", "a") is not None  # a used: b is now the least recent
    await store.put("b4", "d", unit(4), b"d", LONG_TTL_S)
    assert await store.get("b2", "b") is None
    assert len(store) == 3
    # A near-duplicate hit counts as a use too.
    assert await store.nearest("b3", unit(3), 0.99) is not None  # order now: a, d, c
    await store.put("b5", "e", unit(5), b"e", LONG_TTL_S)
    assert await store.get("b1", "a") is None
    for bucket, key in (("b3", "c"), ("b4", "d"), ("b5", "e")):
        assert await store.get(bucket, key) is not None
    assert (await store.status())["entries"] == 3


async def test_expired_entries_are_dropped_when_met() -> None:
    clock = FakeClock()
    store = memory_store(clock)
    await store.put("b", "short1", unit(1), b"1", 5)
    await store.put("b", "short2", unit(2), b"2", 5)
    await store.put("b", "long", unit(3), b"3", LONG_TTL_S)
    await store.put("c", "short", unit(1), b"4", 5)
    await clock.advance(5)  # expiry is inclusive
    assert len(store) == 4
    assert await store.get("c", "short") is None
    assert len(store) == 3
    assert await store.nearest("b", unit(3), 0.99) is not None  # the scan drops both
    assert len(store) == 1
    # A full bucket drops its expired entries before live ones.
    await store.put("b", "s", unit(4), b"s", 5)
    await clock.advance(6)
    for i in range(MAX_PER_BUCKET - 1):
        await store.put("b", f"n{i}", unit(10 + i), b"n", LONG_TTL_S)
    assert await store.get("b", "long") is not None
    assert (await store.status()) == {"backend": "memory", "ready": True, "entries": 4}


async def test_hit_age_and_close() -> None:
    clock = FakeClock()
    store = memory_store(clock)
    await store.put("b", "k", unit(1), b"v", 60)
    await clock.advance(12.5)
    hit = await store.get("b", "k")
    assert hit is not None and hit.age_s == 12.5
    await store.close()
    assert len(store) == 0


def test_rejects_empty_caps() -> None:
    with pytest.raises(ValueError):
        MemoryCacheStore(max_entries=0, max_per_bucket=1)


async def test_build_store_picks_the_backend() -> None:
    memory = build_store(CacheSettings(max_entries=7, max_per_bucket=3))
    assert isinstance(memory, MemoryCacheStore)
    assert (memory.max_entries, memory.max_per_bucket) == (7, 3)
    settings = CacheSettings(
        backend="redis",
        redis_url="redis://:secret@127.0.0.1:1/2",
        redis_prefix="gw1:",
        max_per_bucket=5,
        redis_timeout_s=0.5,
    )
    redis_store = build_store(settings)
    assert isinstance(redis_store, RedisCacheStore)
    assert (redis_store.prefix, redis_store.max_per_bucket, redis_store.timeout_s) == (
        "gw1:",
        5,
        0.5,
    )
    assert redis_store.url == "redis://127.0.0.1:1/2"
    await redis_store.close()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6380/0", "redis://127.0.0.1:6380/0"),
        ("redis://:pw@cache:6379/1", "redis://cache:6379/1"),
        ("rediss://app:p%40ss@cache.internal:6380/0", "rediss://app@cache.internal:6380/0"),
        ("unix:///run/redis.sock?db=2&password=pw", "unix:///run/redis.sock?db=2"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def _reference_nearest(
    store: MemoryCacheStore, bucket: str, vector: list[float], threshold: float, refused: set[str]
) -> tuple[bytes, float] | None:
    """The near-duplicate answer computed from the bucket's entries alone (no kept index):
    live entries with a vector in stored order, the best cosine at least ``threshold`` that
    ``refused`` does not name, ties to the last stored."""
    slot = store._buckets.get(bucket)
    if slot is None:
        return None
    now = store._clock()
    live = [(k, e) for k, e in slot.entries.items() if e.vector is not None and e.expires_at > now]
    if not live:
        return None
    query = np.asarray(vector, np.float64) / np.linalg.norm(vector)
    scores = np.array([float(e.vector @ query) for _, e in live])  # type: ignore[operator]
    for i in _winners(scores, threshold):
        key, entry = live[i]
        if key not in refused:
            return entry.value, min(1.0, float(scores[i]))
    return None


async def test_kept_index_answers_as_one_built_from_the_entries() -> None:
    """The near-duplicate index a bucket keeps up to date (rows appended on a store, dead rows
    on a removal, rebuilt once half dead) answers every lookup as the bucket's live entries
    do: same winner, the same similarity (to float32 rounding), ties to the last stored."""
    rng = np.random.default_rng(7)
    clock = FakeClock()
    store = MemoryCacheStore(max_entries=40, max_per_bucket=24, clock=clock)
    vectors = [unit(seed) for seed in range(6)]  # few: repeats make exact ties
    vectors.append([0.0] * len(vectors[0]))  # stored without a vector
    rebuilt = 0
    for step in range(3_000):
        bucket = f"b{rng.integers(3)}"
        action = rng.random()
        if action < 0.6:
            key = f"k{rng.integers(60)}"
            ttl = float(rng.choice([1.0, 5.0, 1_000.0]))
            vector = vectors[rng.integers(len(vectors))]
            await store.put(bucket, key, vector, key.encode(), ttl, query=key)
        elif action < 0.7:
            await clock.advance(float(rng.choice([0.5, 2.0])))
        else:
            query = vectors[rng.integers(len(vectors) - 1)]
            threshold = float(rng.choice([0.5, 0.95, 1.0]))
            refused = {f"k{rng.integers(60)}"}  # the near check refuses this one entry's query
            expected = _reference_nearest(store, bucket, query, threshold, refused)
            slot = store._buckets.get(bucket)
            before = slot.index if slot is not None else None
            accept = refused.__contains__
            kept = await store.nearest(bucket, query, threshold, lambda q, a=accept: not a(q))
            rebuilt += slot is not None and slot.index is not before
            assert (kept and kept.value) == (expected and expected[0]), step
            if kept and expected:  # one matmul over more rows may round the last bit apart
                assert kept.similarity == pytest.approx(expected[1], abs=1e-6), step
    assert rebuilt < 300  # the index is kept between lookups, not rebuilt for each


async def test_stores_without_lookups_do_not_grow_the_kept_index() -> None:
    store = MemoryCacheStore(max_entries=1_000, max_per_bucket=8, clock=FakeClock())
    await store.put("b", "k0", unit(0), b"v", LONG_TTL_S)
    assert await store.nearest("b", unit(0), 0.99) is not None  # the index is built
    for i in range(1, 500):  # each store drops the bucket's oldest entry
        await store.put("b", f"k{i}", unit(i), b"v", LONG_TTL_S)
        index = store._buckets["b"].index
        assert index is None or index.n <= 2 * 8 + 16
    hit = await store.nearest("b", unit(499), 0.99)
    assert hit is not None and hit.similarity == pytest.approx(1.0)
    assert await store.nearest("b", unit(0), 0.99) is None  # dropped long ago
