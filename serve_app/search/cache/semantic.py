"""The semantic cache of rag.search_docs.

An answer is kept in a *bucket* named by everything that decides it besides the query text:
the agent, the caller's compiled access scope (team, visibilities, roles, groups,
permissions, doc types, user — ``AccessContext.scope_key``), the compiled filter, the request
shape after the profile (top_k, method, fusion, rerank, budget, ...) and the team's index
generation (batch_ingest/generations.py), which every ingest, delete, reindex swap and graph
upsert raises. Inside a bucket the normalised query text is the exact key; a different query
whose embedding has a cosine of at least ``cache.similarity`` with a stored one is a near
duplicate and gets its answer — if its words agree with those of the query the answer was made
for (``cache.near_check``, wording.py; issue 38, item 7): every entry keeps that normalised
query, and a near duplicate that fails the check (or whose entry has no query, stored by an
older version) is a miss, ``near_refused``, whose own answer is then stored. Two callers
whose scopes differ in anything never share a bucket, so a cached answer cannot cross a
scope; a write to the team makes every older entry unreachable at once, in every replica.

A BM25-only search (light profiles) matches exact repeats only: an embedding would cost more
than the search. A cache that fails (Redis down, state database unreadable) is skipped: the
search runs uncached and says so in ``cache.status``."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from batch_ingest.generations import IndexGenerations
from deployments.errors import BackendUnavailable
from deployments.protocols import SearchFilter
from serve_app.search.cache import wording
from serve_app.search.cache.protocol import Accept, CacheHit, CacheStore
from serve_app.search.cache.shared_reads import SharedReads
from serve_app.settings import CacheSettings

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 5.0


def normalise(query: str) -> str:
    return " ".join(query.casefold().split())


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=_plain, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    if isinstance(value, frozenset | set | tuple):
        return sorted(value, key=str)
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)


@dataclass
class Lookup:
    """One request's place in the cache and what the lookup found."""

    bucket: str = ""
    key: str = ""
    # The normalised query (its digest is ``key``), stored with the answer.
    query: str = ""
    ttl_s: float = 0.0
    # The query embedding made for the near-duplicate match (the search reuses it), or why
    # it could not be made (the search falls back to BM25 as usual).
    vector: list[float] | None = None
    embed_error: str | None = None
    hit: CacheHit | None = None
    # "hit", "miss", "near_refused" (a miss: near duplicates were found, none passed the
    # near check), "bypass" (not cacheable: ttl 0) or "unavailable: <reason>".
    status: str = "miss"
    # Near duplicates the near check refused in this lookup.
    refused: int = 0
    # The team's index generation, read after the request arrived (None: not read). The
    # in-memory index skips its change-log read when it shows nothing was written since.
    generation: int | None = None


class SemanticCache:
    def __init__(
        self,
        settings: CacheSettings,
        store: CacheStore,
        generations: IndexGenerations | None,
        embed_query: Callable[[str], Awaitable[list[float] | None]],
    ) -> None:
        self.settings = settings
        self.store = store
        self.generations = generations
        # Concurrent lookups of a team share one read of its generation (never one that
        # began before they arrived: a write acknowledged before a search is always seen).
        self._generation_reads = (
            SharedReads(generations.get, generations.read_now) if generations else None
        )
        # The search pipeline's own query embedding (QueryVectors.vector), so the vector
        # made here is the one the search then uses.
        self.embed_query = embed_query
        self.hits = 0
        self.misses = 0
        # Of the hits, near duplicates; of the misses, lookups whose near duplicates were all
        # refused by the near check; and the refused candidates.
        self.near_hits = 0
        self.near_refused = 0
        self.near_refused_candidates = 0
        # After a store failure the cache is skipped for ``RETRY_AFTER_S`` (a hung Redis
        # would otherwise cost every search its timeout, twice).
        self._down_until = 0.0
        self._down_reason = ""

    @property
    def backend(self) -> str:
        return self.settings.backend

    def ttl_for(self, profile_ttl: float | None) -> float:
        """The profile's TTL, never longer than the cache's own (0: not cached)."""
        if not self.settings.enabled or self.generations is None:
            return 0.0
        if profile_ttl is None:
            return self.settings.ttl_s
        return min(profile_ttl, self.settings.ttl_s)

    async def lookup(
        self,
        *,
        agent_id: str,
        scope: tuple[Any, ...],
        flt: SearchFilter,
        shape: dict[str, Any],
        query: str,
        dense: bool,
        ttl_s: float,
    ) -> Lookup:
        """The cached answer of this request, if any. ``dense``: the search embeds the query
        anyway, so a near-duplicate lookup costs nothing extra."""
        if ttl_s <= 0 or self._generation_reads is None:
            return Lookup(status="bypass")
        if time.monotonic() < self._down_until:
            return Lookup(status=f"unavailable: {self._down_reason} (retrying shortly)")
        try:
            generation = await self._generation_reads.get(flt.team_id)
        except Exception as exc:
            logger.warning("semantic cache skipped: index generation unreadable: %s", exc)
            return Lookup(status=f"unavailable: index generation unreadable: {exc}")
        bucket = digest([agent_id, scope, flt, shape, generation])
        text = normalise(query)
        found = Lookup(
            bucket=bucket, key=digest(text), query=text, ttl_s=ttl_s, generation=generation
        )
        try:
            found.hit = await self.store.get(bucket, found.key)
            if found.hit is None and dense and self.settings.similarity < 1.0:
                try:
                    found.vector = await self.embed_query(query)
                except BackendUnavailable as exc:
                    found.embed_error = exc.message
                if found.vector is not None:
                    found.hit = await self.store.nearest(
                        bucket, found.vector, self.settings.similarity, self._near_check(found)
                    )
        except BackendUnavailable as exc:
            logger.warning("semantic cache skipped: %s", exc.message)
            self._trip(exc.message)
            found.status = f"unavailable: {exc.message}"
            found.hit = None
            return found
        self.near_refused_candidates += found.refused
        if found.hit is not None:
            found.status = "hit"
            self.hits += 1
            if found.hit.similarity < 1.0:
                self.near_hits += 1
                await self._remember_wording(found)
        else:
            self.misses += 1
            if found.refused:
                found.status = "near_refused"
                self.near_refused += 1
        return found

    def _near_check(self, found: Lookup) -> Accept | None:
        """The check a near duplicate's stored query must pass (None: ``near_check`` off);
        it counts the candidates it refuses in ``found.refused``."""
        if self.settings.near_check == "off":
            return None
        mine = wording.terms(found.query)
        min_jaccard = self.settings.near_min_jaccard

        def accept(stored: str | None) -> bool:
            # An entry without its query (an older version's) cannot be checked: refused.
            if stored is not None and wording.agree(mine, wording.terms(stored), min_jaccard):
                return True
            found.refused += 1
            return False

        return accept

    async def _remember_wording(self, found: Lookup) -> None:
        """A near duplicate's answer stored under its own wording too (for what is left of
        the entry's time), so its next repeat is an exact hit, with no embedding or scan. It
        keeps the query the answer was made for, so later near duplicates are checked against
        that one (checks never chain from wording to wording)."""
        assert found.hit is not None
        left = found.ttl_s - found.hit.age_s
        if left <= 0:
            return
        hit = found.hit
        try:
            await self.store.put(found.bucket, found.key, found.vector, hit.value, left, hit.query)
        except BackendUnavailable as exc:
            logger.warning("semantic cache not written: %s", exc.message)
            self._trip(exc.message)

    async def put(self, found: Lookup, value: bytes) -> None:
        if found.status not in ("miss", "near_refused") or not found.bucket:
            return
        try:
            await self.store.put(
                found.bucket, found.key, found.vector, value, found.ttl_s, found.query
            )
        except BackendUnavailable as exc:
            logger.warning("semantic cache not written: %s", exc.message)
            self._trip(exc.message)

    def _trip(self, reason: str) -> None:
        self._down_until = time.monotonic() + RETRY_AFTER_S
        self._down_reason = reason

    async def status(self) -> dict[str, Any]:
        started = time.perf_counter()
        body = dict(await self.store.status())
        body.update(
            enabled=self.settings.enabled,
            hits=self.hits,
            misses=self.misses,
            near_hits=self.near_hits,
            near_refused=self.near_refused,
            near_refused_candidates=self.near_refused_candidates,
            ttl_s=self.settings.ttl_s,
            similarity=self.settings.similarity,
            near_check=self.settings.near_check,
            took_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        if self._generation_reads is not None:  # generation reads made, and lookups sharing one
            reads = self._generation_reads
            body.update(
                generation_reads=reads.reads,
                generation_reads_shared=reads.shared,
                generation_reads_direct=reads.direct,
            )
        return body
