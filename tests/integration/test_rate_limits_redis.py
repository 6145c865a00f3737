"""Rate-limit buckets shared in the real Redis of scripts/services.py: two replicas (two
limiters, two clients) draw from one bucket, and a Redis that does not answer skips the limit
within its timeout instead of failing the request."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis

from serve_app.http.rate_limits import RateLimited, RateLimiter
from serve_app.settings import RateLimitSettings
from tests.integration.test_cache_redis import redis_url  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def limiter(url: str, prefix: str, **settings) -> RateLimiter:
    s = RateLimitSettings(backend="redis", redis_url=url, redis_prefix=prefix, **settings)
    return RateLimiter.from_settings(s, "memory", "")


async def test_two_replicas_share_one_bucket(redis_url):  # noqa: F811
    prefix = f"rag:it:rl:{uuid.uuid4().hex[:8]}:"
    one = limiter(redis_url, prefix, per_credential_per_s=0.01, per_credential_burst=3)
    two = limiter(redis_url, prefix, per_credential_per_s=0.01, per_credential_burst=3)
    try:
        await one.admit("key:abc", [])
        await two.admit("key:abc", [])
        await one.admit("key:abc", [])
        with pytest.raises(RateLimited) as refused:
            await two.admit("key:abc", [])
        assert refused.value.retry_after_s > 1
        await two.admit("key:other", [])  # another credential, another bucket
        keys = {k.decode() async for k in one.redis.scan_iter(match=prefix + "*")}
        assert keys == {prefix + "cred:key:abc", prefix + "cred:key:other"}
        ttl = await one.redis.pttl(prefix + "cred:key:abc")
        assert ttl > 0  # buckets expire by themselves
    finally:
        client = aioredis.Redis.from_url(redis_url)
        for key in [k async for k in client.scan_iter(match=prefix + "*")]:
            await client.delete(key)
        await client.aclose()
        await one.close()
        await two.close()


async def test_a_silent_redis_skips_the_limit_within_its_timeout():
    # A listening socket that never answers: the connect succeeds, the reply never comes.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    silent = limiter(
        f"redis://127.0.0.1:{port}/0",
        "rag:it:rl:",
        per_credential_burst=1,
        redis_timeout_s=0.2,
    )
    try:
        started = time.monotonic()
        for _ in range(3):  # over the burst, but the limit cannot be checked: admitted
            await silent.admit("key:abc", ["dao_x"])
        assert time.monotonic() - started < 3 * 2 * 0.2 + 0.5
    finally:
        server.close()
        await silent.close()
