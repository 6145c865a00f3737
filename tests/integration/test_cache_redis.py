"""RedisCacheStore against the real redis-server started by scripts/services.py
(127.0.0.1:6380, ``url redis``): the store contract of tests/cache_contract.py with real short
ttls, two replicas sharing one cache, the key layout, and an unreachable or silent Redis
failing fast with BackendUnavailable.

Every test has its own key prefix (the run id and a random tag) and clears it at the end.
Skipped when RAG_TEST_REDIS_URL is unset outside CI (scripts/test.sh sets it); failed when it
is unset in CI or names a Redis that is not running."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from deployments.errors import BackendUnavailable
from serve_app.search.cache.store import RedisCacheStore
from tests.cache_contract import CHECKS, LONG_TTL_S, MAX_PER_BUCKET, Check, RealClock, near, unit
from tests.conftest import port_open

pytestmark = pytest.mark.integration

# Generous for a loaded 2-core CI machine; the fail-fast tests use their own, short ones.
TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def redis_url() -> str:
    url = os.environ.get("RAG_TEST_REDIS_URL", "")
    if not url:
        message = (
            "RAG_TEST_REDIS_URL is not set; start Redis with `.venv/bin/python "
            "scripts/services.py up --only redis` and export "
            "RAG_TEST_REDIS_URL=$(.venv/bin/python scripts/services.py url redis) "
            "(scripts/test.sh does both)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    parsed = urlparse(url)
    if not port_open(parsed.hostname or "127.0.0.1", parsed.port or 6379):
        pytest.fail(
            f"Redis is not running at {url}; start it with "
            "`.venv/bin/python scripts/services.py up --only redis` (scripts/test.sh does this)",
            pytrace=False,
        )
    return url


@pytest.fixture
def prefix(run_id: str) -> str:
    return f"rag:it:{run_id}:{uuid.uuid4().hex[:8]}:"


@pytest_asyncio.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest_asyncio.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[RedisCacheStore]:
    store = RedisCacheStore(redis_url, prefix, MAX_PER_BUCKET, TIMEOUT_S)
    yield store
    await store.clear()
    await store.close()


async def keys_under(raw: aioredis.Redis, prefix: str) -> list[bytes]:
    return sorted([key async for key in raw.scan_iter(match=f"{prefix}*")])


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_contract(check: Check, store: RedisCacheStore) -> None:
    await check(store, RealClock())


async def test_two_replicas_share_entries(redis_url: str, prefix: str, raw) -> None:
    a = RedisCacheStore(redis_url, prefix, MAX_PER_BUCKET, TIMEOUT_S)
    b = RedisCacheStore(redis_url, prefix, MAX_PER_BUCKET, TIMEOUT_S)
    try:
        v = unit(1)
        await a.put("bucket", "q", v, b"from a", LONG_TTL_S)
        hit = await b.get("bucket", "q")
        assert hit is not None and hit.value == b"from a"
        hit = await b.nearest("bucket", near(v, 0.97), 0.95)
        assert hit is not None and hit.value == b"from a"
        await b.put("bucket", "q", v, b"from b", LONG_TTL_S)
        hit = await a.get("bucket", "q")
        assert hit is not None and hit.value == b"from b"
        # The per-bucket cap holds for both replicas' puts together.
        for i in range(2 * MAX_PER_BUCKET):
            await (a if i % 2 else b).put("bucket", f"k{i}", unit(10 + i), b"x", LONG_TTL_S)
        assert await raw.hlen(f"{prefix}b:bucket") == MAX_PER_BUCKET
        values = [k for k in await keys_under(raw, prefix) if k.startswith(f"{prefix}v:".encode())]
        assert len(values) == MAX_PER_BUCKET
        # One replica's clear empties the shared cache.
        assert await a.clear() == MAX_PER_BUCKET
        assert await b.get("bucket", f"k{2 * MAX_PER_BUCKET - 1}") is None
    finally:
        await a.clear()
        await a.close()
        await b.close()


async def test_key_layout_and_expiry(store: RedisCacheStore, prefix: str, raw) -> None:
    await store.put("team:1", "q", unit(1), b"v", 30)
    await store.put("team:1", "q2", unit(2), b"v2", 120)
    await store.put("team:1", "q3", None, b"v3", 10)
    value_key = f"{prefix}v:6:team:1:q".encode()
    bucket_key = f"{prefix}b:team:1".encode()
    assert await keys_under(raw, prefix) == sorted(
        [
            bucket_key,
            value_key,
            f"{prefix}v:6:team:1:q2".encode(),
            f"{prefix}v:6:team:1:q3".encode(),
        ]
    )
    assert 29_000 < await raw.pttl(value_key) <= 30_000
    # The bucket's hash outlives its longest-lived entry, and a shorter put never shortens it.
    assert 119_000 < await raw.pttl(bucket_key) <= 120_000


async def test_clear_keeps_other_prefixes(redis_url: str, prefix: str, raw) -> None:
    # Unescaped, the glob of "...a*:" would match "...ab:" too.
    star = RedisCacheStore(redis_url, prefix + "a*:", MAX_PER_BUCKET, TIMEOUT_S)
    plain = RedisCacheStore(redis_url, prefix + "ab:", MAX_PER_BUCKET, TIMEOUT_S)
    try:
        await star.put("b", "k", unit(1), b"star", LONG_TTL_S)
        await plain.put("b", "k", unit(1), b"plain", LONG_TTL_S)
        await plain.put("b", "k2", None, b"plain 2", LONG_TTL_S)
        assert await star.clear() == 1
        assert await star.get("b", "k") is None
        hit = await plain.get("b", "k")
        assert hit is not None and hit.value == b"plain"
        assert len(await keys_under(raw, prefix + "ab:")) == 3  # two values and the bucket
        assert await plain.clear() == 2
        assert await keys_under(raw, prefix) == []
    finally:
        for store in (star, plain):
            await store.clear()
            await store.close()


async def test_evicted_value_is_a_miss(store: RedisCacheStore, prefix: str, raw) -> None:
    """Under maxmemory allkeys-lru Redis may evict a value before its bucket's record."""
    await store.put("b", "k", unit(1), b"v", LONG_TTL_S)
    await raw.delete(f"{prefix}v:1:b:k")
    assert await store.nearest("b", unit(1), 0.95) is None
    assert not await raw.hexists(f"{prefix}b:b", "k")
    assert await store.get("b", "k") is None


async def test_records_without_a_query_stay_readable(
    store: RedisCacheStore, prefix: str, raw
) -> None:
    """A record written before entries kept their query (header + vector only) is still found
    exactly and by ``nearest``, with query None; a record with a query has its tail."""
    v = unit(1)
    await store.put("b", "new", v, b"new", LONG_TTL_S, "the query")
    record = await raw.hget(f"{prefix}b:b", "new")
    assert record.endswith(b"the query" + (9).to_bytes(4, "little") + b"qry1")
    old_record = record[: 16 + 4 * len(v)]
    await raw.hset(f"{prefix}b:b", "old", old_record)
    await raw.set(f"{prefix}v:1:b:old", record[8:16] + b"old answer", px=60_000)
    old = await store.get("b", "old")
    assert old is not None and old.value == b"old answer"
    hit = await store.nearest("b", v, 0.95)  # a tie: the old record's stored_at is the same
    assert hit is not None
    refused = await store.nearest("b", v, 0.95, lambda q: q is None)
    assert refused is not None and refused.value == b"old answer" and refused.query is None
    checked = await store.nearest("b", v, 0.95, lambda q: q is not None)
    assert checked is not None and checked.value == b"new" and checked.query == "the query"


async def test_status(redis_url: str, store: RedisCacheStore) -> None:
    status = await store.status()
    assert status == {"backend": "redis", "ready": True, "url": redis_url, "error": None}


async def assert_fails_fast(store: RedisCacheStore, limit_s: float) -> None:
    calls = {
        "get": store.get("b", "k"),
        "nearest": store.nearest("b", unit(1), 0.9),
        "put": store.put("b", "k", unit(1), b"v", 10),
        "clear": store.clear(),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as info:
            await asyncio.wait_for(call, 10)
        elapsed = time.monotonic() - started
        assert elapsed < limit_s, f"{name} took {elapsed:.2f}s"
        assert str(info.value).startswith("redis cache: ")
        assert info.value.backend == "redis cache"
    status = await store.status()
    assert status["ready"] is False and status["error"]
    assert "secret" not in status["url"]


async def test_unreachable_redis_raises_backend_unavailable() -> None:
    store = RedisCacheStore("redis://:secret@127.0.0.1:1/0", "rag:it:down:", 4, 0.3)
    try:
        # A refused connection fails in milliseconds; the bound only tells "fails at once"
        # from "retries or hangs" (the call is cut at 10 s). 1.0 s failed once in CI (1.52 s)
        # while the 2 cores ran other suites, so it leaves room for a starved scheduler.
        await assert_fails_fast(store, 2.5)
    finally:
        await store.close()


async def test_silent_redis_times_out() -> None:
    """A server that accepts connections and never answers (a hung or partitioned Redis)."""
    conns: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisCacheStore(f"redis://:secret@127.0.0.1:{port}/0", "rag:it:silent:", 4, 0.3)
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as info:
            await store.get("b", "k")
        assert 0.25 < time.monotonic() - started < 1.5
        assert "redis cache: get failed" in str(info.value)
        await assert_fails_fast(store, 1.5)
    finally:
        await store.close()
        for writer in conns:
            writer.close()
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
