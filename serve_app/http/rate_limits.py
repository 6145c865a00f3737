"""Rate limits per credential and per team: token buckets (pyrate-limiter's ``TokenBucket``)
kept in this replica's memory, or in Redis so every replica draws from the same bucket.

A request takes one token from its credential's bucket (the API key, else the token's
subject; an agent profile may set its own rate) and one from each team it names that the
credential grants (a team it does not grant is refused by the policy anyway, and must not
drain that team's bucket). A request that finds a bucket empty is answered 429
``rate_limited`` with ``Retry-After``, audited as a deny; a refused request takes nothing.
When Redis does not answer within ``redis_timeout_s`` the limit is skipped (logged, the
request goes on): a limiter must not turn a cache outage into an outage of the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyrate_limiter import Rate
from pyrate_limiter.abstracts.algorithm import TokenBucket
from pyrate_limiter.buckets.redis_state import RedisStateStore
from pyrate_limiter.buckets.state_bucket import InMemoryStateStore

from deployments.errors import GatewayError
from serve_app.settings import RateLimitSettings

logger = logging.getLogger(__name__)

# Buckets kept in one replica's memory at most (least recently used dropped first).
MAX_LOCAL_BUCKETS = 100_000


class RateLimited(GatewayError):
    """A bucket of the caller is empty: 429 with ``Retry-After`` (whole seconds)."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: float, reason: str) -> None:
        super().__init__(
            message,
            hint=f"retry after {retry_after_s:.2f} s (Retry-After)",
            reason=reason,
        )
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"retry-after": str(max(1, math.ceil(self.retry_after_s)))}


@dataclass(frozen=True)
class Limit:
    """A bucket's refill rate and size."""

    per_s: float
    burst: int

    def rate(self) -> Rate:
        # Rate(limit, interval_ms): a refill every interval/limit ms; a large limit over a
        # long interval keeps fractional rates (0.5/s) exact.
        return Rate(max(1, round(self.per_s * 1000)), 1_000_000, burst=self.burst)


class RateLimiter:
    """Checks the buckets of one request; ``redis``: an asyncio Redis client (shared
    buckets), else buckets in this process."""

    def __init__(self, settings: RateLimitSettings, redis: Any = None) -> None:
        self.settings = settings
        self.redis = redis
        self._algorithm = TokenBucket()
        self._local: OrderedDict[str, InMemoryStateStore] = OrderedDict()
        self._remote: OrderedDict[str, RedisStateStore] = OrderedDict()

    @classmethod
    def from_settings(
        cls, settings: RateLimitSettings, cache_backend: str, cache_redis_url: str
    ) -> RateLimiter:
        backend = settings.backend
        if backend == "auto":
            backend = "redis" if cache_backend == "redis" else "memory"
        if backend == "memory":
            return cls(settings)
        import redis.asyncio as aioredis

        url = settings.redis_url or cache_redis_url
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
        )
        return cls(settings, client)

    @property
    def credential_limit(self) -> Limit:
        s = self.settings
        return Limit(s.per_credential_per_s, s.per_credential_burst)

    @property
    def team_limit(self) -> Limit:
        s = self.settings
        return Limit(s.per_team_per_s, s.per_team_burst)

    async def admit(
        self, credential: str, teams: Iterable[str], credential_limit: Limit | None = None
    ) -> None:
        """Take one token from the credential's bucket, then from each team's.

        Raises:
            RateLimited: the first empty bucket (nothing is taken from the later ones).
        """
        if not self.settings.enabled:
            return
        checks = [("credential", f"cred:{credential}", credential_limit or self.credential_limit)]
        checks += [("team", f"team:{team}", self.team_limit) for team in sorted(set(teams))]
        for kind, key, limit in checks:
            wait_ms = await self._take(key, limit)
            if wait_ms is not None:
                label = "this credential" if kind == "credential" else f"team {key[5:]!r}"
                raise RateLimited(
                    f"rate limit of {limit.per_s:g} requests/s (burst {limit.burst}) for "
                    f"{label} reached",
                    retry_after_s=wait_ms / 1000,
                    reason=f"{kind}_rate_limit",
                )

    async def _take(self, key: str, limit: Limit) -> float | None:
        """None when a token was taken, else the milliseconds until one is there."""
        now_ms = int(time.time() * 1000)
        rates = [limit.rate()]
        if self.redis is None:
            decision = self._store(self._local, key, InMemoryStateStore).check(
                self._algorithm, rates, now_ms, 1
            )
        else:
            store = self._store(
                self._remote,
                key,
                lambda: RedisStateStore(self.redis, self.settings.redis_prefix + key),
            )
            try:
                decision = await asyncio.wait_for(
                    store.check(self._algorithm, rates, now_ms, 1),
                    timeout=self.settings.redis_timeout_s,
                )
            except Exception as exc:  # Redis down or slow: no limit rather than no service
                logger.warning("rate limit skipped, Redis did not answer: %r", exc)
                return None
        if decision.allowed:
            return None
        return float(decision.retry_after_ms or 1000)

    @staticmethod
    def _store(stores: OrderedDict[str, Any], key: str, make: Any) -> Any:
        store = stores.get(key)
        if store is None:
            store = stores[key] = make()
            if len(stores) > MAX_LOCAL_BUCKETS:
                stores.popitem(last=False)
        else:
            stores.move_to_end(key)
        return store

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()
