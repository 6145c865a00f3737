"""Where semantic-cache entries live: in this process (``MemoryCacheStore``, one cache per
ingress replica, the embedded default) or in Redis (``RedisCacheStore``, one cache shared by
every replica). Both implement ``CacheStore`` (protocol.py); ``build_store`` picks one from
``cache.backend``.

Values are opaque bytes; vectors are query embeddings, normalised here (a zero or non-finite
vector is stored without one, so it never answers ``nearest``). Each entry also keeps the
normalised query its answer was made for, which ``nearest`` reports and hands to its
``accept`` check (an entry stored without one reports None). Buckets never see each other:
an entry answers only lookups in its own bucket, however close its vector."""

from __future__ import annotations

import asyncio
import contextlib
import math
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from deployments.errors import BackendUnavailable
from serve_app.search.cache.protocol import Accept, CacheHit, CacheStore
from serve_app.settings import CacheSettings

__all__ = ["MemoryCacheStore", "RedisCacheStore", "build_store", "redact_url"]

T = TypeVar("T")

# A cosine this far below the threshold still matches: float32 rounding puts the cosine of
# two identical unit vectors anywhere in 1 +- 1e-7, and similarity=1.0 must keep matching them.
_THRESHOLD_SLACK = 1e-6
# Cosines this close to the best are a tie, won by the most recently stored entry.
_TIE = 1e-6


def _unit(vector: Sequence[float] | None) -> np.ndarray | None:
    """``vector`` as a unit float32 array; None for no vector, an empty, zero or non-finite
    one (such an entry is found by its exact key only)."""
    if vector is None:
        return None
    array = np.asarray(vector, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        return None
    norm = float(np.linalg.norm(array))
    if not math.isfinite(norm) or norm < 1e-12:
        return None
    return (array / norm).astype(np.float32)


def _best(scores: np.ndarray, threshold: float) -> int | None:
    """Index of the winning score: the highest, if at least ``threshold``; of tied scores
    the last (the rows are in the order they were stored). -inf rows never win."""
    if scores.size == 0:
        return None
    best = float(scores.max())
    if not best >= threshold - _THRESHOLD_SLACK:
        return None
    return int(np.flatnonzero(scores >= best - _TIE)[-1])


def _winners(scores: np.ndarray, threshold: float) -> Iterator[int]:
    """The indices of the scores at least ``threshold``, in the order they win (``_best``:
    the highest first, ties to the last stored): the candidates of a near-duplicate lookup
    whose winner its ``accept`` check refused."""
    left = np.array(scores, dtype=np.float64)
    while (i := _best(left, threshold)) is not None:
        yield i
        left[i] = -np.inf


def _ttl_ok(ttl_s: float) -> bool:
    return math.isfinite(ttl_s) and ttl_s > 0


# --- in process ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Entry:
    expires_at: float
    stored_at: float
    vector: np.ndarray | None
    value: bytes
    query: str | None


class _Index:
    """The vectors of one bucket of one dimension, stacked for one matmul, rows in stored
    order. Kept up to date as entries come and go, so a lookup after a store costs no
    rebuild: a stored entry is appended (the matrix grows by doubling), a removed one leaves
    a dead row (expiry -inf: never live, never a winner) until dead rows are half of the
    matrix, when the bucket builds it afresh."""

    __slots__ = ("dim", "keys", "rows", "matrix", "expires_at", "n", "dead")

    def __init__(self, dim: int, capacity: int = 16) -> None:
        self.dim = dim
        self.keys: list[str | None] = []  # None: a dead row
        self.rows: dict[str, int] = {}
        self.matrix = np.zeros((capacity, dim), np.float32)
        self.expires_at = np.zeros(capacity, np.float64)
        self.n = 0
        self.dead = 0

    def add(self, key: str, vector: np.ndarray, expires_at: float) -> None:
        if self.n == len(self.matrix):
            grown = max(16, 2 * self.n)
            self.matrix = np.resize(self.matrix, (grown, self.dim))
            self.expires_at = np.resize(self.expires_at, grown)
        self.matrix[self.n] = vector
        self.expires_at[self.n] = expires_at
        self.keys.append(key)
        self.rows[key] = self.n
        self.n += 1

    def drop(self, key: str) -> None:
        row = self.rows.pop(key, None)
        if row is not None:
            self.expires_at[row] = -np.inf
            self.keys[row] = None
            self.dead += 1

    @property
    def worn(self) -> bool:
        """Dead rows are at least half of the rows (and worth a rebuild)."""
        return self.dead >= 16 and 2 * self.dead >= self.n


class _Bucket:
    __slots__ = ("entries", "index", "soonest")

    def __init__(self) -> None:
        # Oldest stored first: a re-put moves its key to the end.
        self.entries: OrderedDict[str, _Entry] = OrderedDict()
        self.index: _Index | None = None
        # No entry expires before this (an entry removed since may have set it earlier):
        # a bucket full of live entries is not scanned for expired ones on every store.
        self.soonest = math.inf

    def vectors(self, dim: int) -> _Index:
        index = self.index
        if index is None or index.dim != dim or index.worn:
            index = self.index = _Index(dim, capacity=max(16, len(self.entries)))
            for key, entry in self.entries.items():
                if entry.vector is not None and entry.vector.size == dim:
                    index.add(key, entry.vector, entry.expires_at)
        return index

    def store(self, key: str, entry: _Entry) -> None:
        self.entries[key] = entry
        self.soonest = min(self.soonest, entry.expires_at)
        index, vector = self.index, entry.vector
        if index is not None and index.worn:
            self.index = None  # stores with no lookup between: not grown without bound
        elif index is not None and vector is not None and vector.size == index.dim:
            index.add(key, vector, entry.expires_at)

    def drop(self, key: str) -> bool:
        """Remove ``key``; whether it was here."""
        if self.entries.pop(key, None) is None:
            return False
        if self.index is not None:
            self.index.drop(key)
        return True


class MemoryCacheStore:
    """The cache of one process: at most ``max_entries`` entries in all (the least recently
    used, stored or hit, dropped first) and ``max_per_bucket`` per bucket (its oldest
    dropped first, which bounds the near-duplicate scan). Expired entries are never
    returned and are dropped when met. Nothing here awaits: every call is a few dict
    operations, and ``nearest`` one matmul over the bucket's vectors."""

    def __init__(
        self,
        max_entries: int,
        max_per_bucket: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or max_per_bucket < 1:
            raise ValueError("max_entries and max_per_bucket must be at least 1")
        self.max_entries = max_entries
        self.max_per_bucket = max_per_bucket
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        # Every (bucket, key), least recently used first.
        self._lru: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def _remove(self, bucket: str, key: str) -> None:
        slot = self._buckets.get(bucket)
        if slot is not None and slot.drop(key) and not slot.entries:
            del self._buckets[bucket]
        self._lru.pop((bucket, key), None)

    def _purge_expired(self, bucket: str, now: float) -> None:
        slot = self._buckets.get(bucket)
        if slot is None or slot.soonest > now:
            return
        for key in [k for k, e in slot.entries.items() if e.expires_at <= now]:
            self._remove(bucket, key)
        if bucket in self._buckets:
            slot.soonest = min((e.expires_at for e in slot.entries.values()), default=math.inf)

    def _hit(self, bucket: str, entry: _Entry, key: str, similarity: float, now: float) -> CacheHit:
        self._lru.move_to_end((bucket, key))
        return CacheHit(entry.value, similarity, max(0.0, now - entry.stored_at), entry.query)

    async def get(self, bucket: str, key: str) -> CacheHit | None:
        slot = self._buckets.get(bucket)
        entry = slot.entries.get(key) if slot is not None else None
        if entry is None:
            return None
        now = self._clock()
        if entry.expires_at <= now:
            self._remove(bucket, key)
            return None
        return self._hit(bucket, entry, key, 1.0, now)

    async def nearest(
        self,
        bucket: str,
        vector: list[float],
        threshold: float,
        accept: Accept | None = None,
    ) -> CacheHit | None:
        query = _unit(vector)
        slot = self._buckets.get(bucket)
        if query is None or slot is None:
            return None
        now = self._clock()
        index = slot.vectors(query.size)
        expires_at = index.expires_at[: index.n]
        live = expires_at > now
        scores = np.where(live, index.matrix[: index.n] @ query, -np.inf)
        won: tuple[int, str] | None = None
        for candidate in _winners(scores, threshold):
            key = index.keys[candidate]  # a live row: never a dead one's None
            if key is not None and (accept is None or accept(slot.entries[key].query)):
                won = candidate, key
                break
        if np.count_nonzero(live) < index.n - index.dead:  # an entry expired (not a dead row)
            self._purge_expired(bucket, now)  # the winner, if any, is live and stays
        if won is None:
            return None
        i, key = won
        entry = self._buckets[bucket].entries[key]
        return self._hit(bucket, entry, key, min(1.0, float(scores[i])), now)

    async def put(
        self,
        bucket: str,
        key: str,
        vector: list[float] | None,
        value: bytes,
        ttl_s: float,
        query: str | None = None,
    ) -> None:
        self._remove(bucket, key)
        if not _ttl_ok(ttl_s):
            return
        now = self._clock()
        slot = self._buckets.setdefault(bucket, _Bucket())
        slot.store(key, _Entry(now + ttl_s, now, _unit(vector), bytes(value), query))
        self._lru[(bucket, key)] = None
        if len(slot.entries) > self.max_per_bucket:
            self._purge_expired(bucket, now)
            while len(slot.entries) > self.max_per_bucket:
                self._remove(bucket, next(iter(slot.entries)))
        while len(self._lru) > self.max_entries:
            old_bucket, old_key = next(iter(self._lru))
            self._remove(old_bucket, old_key)

    async def clear(self) -> int:
        dropped = len(self._lru)
        self._buckets.clear()
        self._lru.clear()
        return dropped

    async def status(self) -> dict[str, Any]:
        return {"backend": "memory", "ready": True, "entries": len(self._lru)}

    async def close(self) -> None:
        await self.clear()


# --- Redis --------------------------------------------------------------------------------

# A bucket's record of one key: expires_at and stored_at (wall-clock microseconds, shared by
# every replica), then the unit vector as little-endian float32 (empty: no vector), then —
# entries with a vector, since issue 38 — the normalised query in UTF-8 and _QUERY_TAIL (its
# length in bytes and a marker). A record without the tail (an older version's) is exactly
# header + vector long: ``nearest`` reports its query as None.
_RECORD = struct.Struct("<qq")
_QUERY_TAIL = struct.Struct("<I4s")
_QUERY_MARK = b"qry1"
# A value is stored behind its stored_at, so that an exact hit needs one GET.
_STAMP = struct.Struct("<q")
_GLOB_SPECIAL = frozenset(b"*?[]\\")


def _record_query(record: bytes, width: int) -> tuple[bool, str | None]:
    """Whether ``record`` holds a vector of ``width - _RECORD.size`` bytes, and the query
    stored behind it (None: none stored)."""
    if len(record) == width:
        return True, None
    end = len(record) - _QUERY_TAIL.size
    if end < width:
        return False, None
    size, mark = _QUERY_TAIL.unpack_from(record, end)
    if mark != _QUERY_MARK or width + size != end:
        return False, None
    try:
        return True, record[width:end].decode()
    except UnicodeDecodeError:
        return True, None


def _glob_escape(text: bytes) -> bytes:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return b"".join(b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in text)


def redact_url(url: str) -> str:
    """``url`` without its password (in the user info or a ``password`` query parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}@{host}" if user else host
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode([(k, v) for k, v in pairs if k.lower() != "password"])
    # Not urlunsplit: it writes unix:///path as unix:/path.
    shown = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc + parts.path
    return shown + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")


class RedisCacheStore:
    """The cache shared by every replica, in Redis (``redis.asyncio``).

    Layout, under ``prefix``: the value of ``key`` in ``bucket`` at
    ``{prefix}v:{len(bucket)}:{bucket}:{key}`` (length in UTF-8 bytes, so that no bucket and
    key pair can name another's value; SET with PX, so Redis expires it), and per bucket a
    hash ``{prefix}b:{bucket}`` of key -> record (expiry, stored_at, vector, query) that
    ``nearest`` scans (and checks with ``accept`` before it reads a value), kept alive as
    long as its longest-lived entry and trimmed to ``max_per_bucket`` (oldest first) on put.
    A record whose value is gone (expired, or evicted under ``maxmemory``) is a miss and is
    dropped.

    Every call takes at most about ``timeout_s`` (``clear``: per SCAN step); a Redis error or
    timeout raises ``BackendUnavailable`` and the caller answers without the cache. Races
    between replicas (one trims or drops a record while another re-puts that key) cost a
    miss: a value is only ever read under its own bucket and key."""

    def __init__(self, url: str, prefix: str, max_per_bucket: int, timeout_s: float) -> None:
        if max_per_bucket < 1 or not timeout_s > 0:
            raise ValueError("max_per_bucket must be at least 1 and timeout_s positive")
        self.url = redact_url(url)
        self.prefix = prefix
        self.max_per_bucket = max_per_bucket
        self.timeout_s = timeout_s
        self._prefix = prefix.encode()
        self._last_stamp = 0
        # One reconnect without back-off (a pooled connection the server closed); the
        # asyncio.wait_for around each call bounds the rest.
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
            decode_responses=False,
        )

    # keys
    def _bucket_key(self, bucket: bytes) -> bytes:
        return self._prefix + b"b:" + bucket

    def _value_key(self, bucket: bytes, key: bytes) -> bytes:
        return self._prefix + b"v:" + str(len(bucket)).encode() + b":" + bucket + b":" + key

    def _stamp(self) -> int:
        """Now in wall-clock microseconds, strictly increasing within this store (so that
        "oldest" and "most recent" are well defined for its own puts)."""
        self._last_stamp = max(time.time_ns() // 1000, self._last_stamp + 1)
        return self._last_stamp

    async def _bounded(self, what: str, call: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(call, self.timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            detail = str(exc) or f"no answer within {self.timeout_s:g}s"
            raise BackendUnavailable(
                "redis cache", f"{what} failed ({type(exc).__name__}: {detail})"
            ) from exc

    async def get(self, bucket: str, key: str) -> CacheHit | None:
        raw = await self._bounded(
            "get", self._redis.get(self._value_key(bucket.encode(), key.encode()))
        )
        if not isinstance(raw, bytes) or len(raw) < _STAMP.size:
            return None
        (stored,) = _STAMP.unpack_from(raw)
        age_s = max(0.0, (time.time_ns() // 1000 - stored) / 1e6)
        return CacheHit(bytes(raw[_STAMP.size :]), 1.0, age_s)

    async def nearest(
        self,
        bucket: str,
        vector: list[float],
        threshold: float,
        accept: Accept | None = None,
    ) -> CacheHit | None:
        query = _unit(vector)
        if query is None:
            return None
        return await self._bounded(
            "nearest", self._nearest(bucket.encode(), query, threshold, accept)
        )

    async def _nearest(
        self, bucket: bytes, query: np.ndarray, threshold: float, accept: Accept | None
    ) -> CacheHit | None:
        hash_key = self._bucket_key(bucket)
        width = _RECORD.size + 4 * query.size
        live, dead = _split_records(await self._redis.hgetall(hash_key))  # type: ignore[arg-type]
        keys: list[bytes] = []
        stored: list[int] = []
        rows: list[bytes] = []
        texts: list[str | None] = []
        for at, field, record in live:
            same_dim, text = _record_query(record, width)
            if same_dim:
                keys.append(field)
                stored.append(at)
                rows.append(record[_RECORD.size : width])
                texts.append(text)
        # Ties go to the most recent: rows sorted by stored_at, _best takes the last.
        order = sorted(range(len(keys)), key=stored.__getitem__)
        matrix = np.frombuffer(b"".join(rows[i] for i in order), dtype="<f4")
        scores = matrix.reshape(len(order), query.size) @ query
        best = None
        for candidate in _winners(scores, threshold):
            if accept is None or accept(texts[order[candidate]]):
                best = candidate
                break
        async with self._redis.pipeline(transaction=False) as pipe:
            if best is not None:
                pipe.get(self._value_key(bucket, keys[order[best]]))
            if dead:
                pipe.hdel(hash_key, *dead)
            results = await pipe.execute() if best is not None or dead else []
        if best is None:
            return None
        raw = results[0]
        if raw is None or len(raw) < _STAMP.size:
            # The value expired or was evicted before its record: drop the record too.
            await self._redis.hdel(hash_key, keys[order[best]])
            return None
        (stored_at,) = _STAMP.unpack_from(raw)
        similarity = min(1.0, float(scores[best]))
        age_s = max(0.0, (time.time_ns() // 1000 - stored_at) / 1e6)
        return CacheHit(bytes(raw[_STAMP.size :]), similarity, age_s, texts[order[best]])

    async def put(
        self,
        bucket: str,
        key: str,
        vector: list[float] | None,
        value: bytes,
        ttl_s: float,
        query: str | None = None,
    ) -> None:
        await self._bounded(
            "put", self._put(bucket.encode(), key.encode(), vector, value, ttl_s, query)
        )

    async def _put(
        self,
        bucket: bytes,
        key: bytes,
        vector: list[float] | None,
        value: bytes,
        ttl_s: float,
        query: str | None,
    ) -> None:
        hash_key = self._bucket_key(bucket)
        value_key = self._value_key(bucket, key)
        if not _ttl_ok(ttl_s):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(value_key)
                pipe.hdel(hash_key, key)
                await pipe.execute()
            return
        unit = _unit(vector)
        now = self._stamp()
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        record = _RECORD.pack(now + ttl_ms * 1000, now)
        if unit is not None:
            record += unit.astype("<f4").tobytes()
            if query is not None:
                text = query.encode()
                record += text + _QUERY_TAIL.pack(len(text), _QUERY_MARK)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(value_key, _STAMP.pack(now) + bytes(value), px=ttl_ms)
            pipe.hset(hash_key, key, record)
            # The hash lives as long as its longest-lived entry: set when it has no expiry,
            # else only ever extended.
            pipe.pexpire(hash_key, ttl_ms, nx=True)
            pipe.pexpire(hash_key, ttl_ms, gt=True)
            pipe.hlen(hash_key)
            *_, size = await pipe.execute()
        if size > self.max_per_bucket:
            await self._trim(hash_key, bucket)

    async def _trim(self, hash_key: bytes, bucket: bytes) -> None:
        """Drop the bucket's expired records and then its oldest, down to max_per_bucket."""
        live, dead = _split_records(await self._redis.hgetall(hash_key))  # type: ignore[arg-type]
        live.sort()
        excess = len(live) - self.max_per_bucket
        if excess > 0:
            dead.extend(field for _, field, _ in live[:excess])
        if not dead:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(hash_key, *dead)
            pipe.unlink(*(self._value_key(bucket, field) for field in dead))
            await pipe.execute()

    async def clear(self) -> int:
        """Delete every key under the prefix (SCAN, then UNLINK per batch); returns how many
        values were dropped. Each step is bounded by ``timeout_s``, the whole walk is not."""
        pattern = _glob_escape(self._prefix) + b"*"
        values = self._prefix + b"v:"
        cursor, dropped = 0, 0
        while True:
            cursor, found = await self._bounded(
                "clear", self._redis.scan(cursor, match=pattern, count=500)
            )
            keys = cast(list[bytes], found)  # decode_responses=False
            if keys:
                dropped += sum(1 for k in keys if k.startswith(values))
                await self._bounded("clear", self._redis.unlink(*keys))
            if cursor == 0:
                return dropped

    async def status(self) -> dict[str, Any]:
        try:
            await self._bounded("ping", self._redis.ping())
        except BackendUnavailable as exc:
            return {"backend": "redis", "ready": False, "url": self.url, "error": exc.message}
        return {"backend": "redis", "ready": True, "url": self.url, "error": None}

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            await asyncio.wait_for(self._redis.aclose(), self.timeout_s)


def build_store(settings: CacheSettings) -> CacheStore:
    """The store ``settings.backend`` names: per replica in memory, or shared in Redis."""
    if settings.backend == "redis":
        return RedisCacheStore(
            settings.redis_url,
            settings.redis_prefix,
            settings.max_per_bucket,
            settings.redis_timeout_s,
        )
    return MemoryCacheStore(settings.max_entries, settings.max_per_bucket)


def _split_records(
    records: dict[bytes, bytes],
) -> tuple[list[tuple[int, bytes, bytes]], list[bytes]]:
    """A bucket hash's records as ``(stored_at, field, record)`` of the live ones and the
    fields of the expired or malformed ones."""
    now = time.time_ns() // 1000
    live: list[tuple[int, bytes, bytes]] = []
    dead: list[bytes] = []
    for field, record in records.items():
        if len(record) < _RECORD.size:
            dead.append(field)
            continue
        expires_at, stored_at = _RECORD.unpack_from(record)
        if expires_at <= now:
            dead.append(field)
        else:
            live.append((stored_at, field, record))
    return live, dead
