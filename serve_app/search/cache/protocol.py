"""What a cache store does. The semantic cache (semantic.py) decides the bucket and key of a
request; a store only keeps bytes with their query vector until they expire.

A *bucket* holds the entries that may answer each other (same agent, team, compiled access
scope, request shape and index generation); a *key* is one exact query inside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# Whether a near-duplicate candidate may answer, given the normalised query its entry was
# stored under (None: an entry stored without one, e.g. by an older version).
Accept = Callable[[str | None], bool]


@dataclass(frozen=True)
class CacheHit:
    value: bytes
    # 1.0 for the exact key; the cosine of the two query vectors for a near duplicate.
    similarity: float
    # Seconds since the entry was stored.
    age_s: float
    # The normalised query the entry's answer was made for, where the store reports it
    # (``nearest`` always does; None: stored without one, e.g. by an older version).
    query: str | None = None


class CacheStore(Protocol):
    async def get(self, bucket: str, key: str) -> CacheHit | None:
        """The live entry stored under exactly ``key`` in ``bucket``."""

    async def nearest(
        self,
        bucket: str,
        vector: list[float],
        threshold: float,
        accept: Accept | None = None,
    ) -> CacheHit | None:
        """The live entry of ``bucket`` whose vector has the highest cosine with ``vector``,
        if that cosine is at least ``threshold`` (vectors are unit length). With ``accept``,
        the best of those whose stored query it accepts (it is asked about the candidates
        from the closest down, until one is accepted)."""

    async def put(
        self,
        bucket: str,
        key: str,
        vector: list[float] | None,
        value: bytes,
        ttl_s: float,
        query: str | None = None,
    ) -> None:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds; ``vector`` (None: exact
        matches only) makes it findable by ``nearest``, which reports ``query`` (the
        normalised query the answer was made for) with it."""

    async def clear(self) -> int:
        """Drop every entry; returns how many were dropped (best effort for Redis)."""

    async def status(self) -> dict[str, Any]:
        """For /readyz: backend, ready, entries (where cheap), errors."""

    async def close(self) -> None: ...
