"""Per-document leases while a batch applies (``SourceStore.claim``): taken with a bounded
wait, renewed while held, and threads that always end before the leases are given back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from batch_ingest.source_store import Key, SourceStore

logger = logging.getLogger(__name__)

# A writer's lease on a document (seconds), renewed every third of it while its batch runs:
# a writer that dies holds its documents this long at most (the consumer's redelivery
# backoff, 5+15+30+60 s by default, spans it).
LEASE_TTL_S = 60.0
# How long a batch waits for a document another writer is applying before reporting it busy.
LEASE_WAIT_S = 10.0


async def renew_leases(sources: SourceStore, keys: list[Key], owner: str, ttl_s: float) -> None:
    """Extend ``owner``'s leases on ``keys`` every third of ``ttl_s`` until cancelled."""
    while keys:
        await asyncio.sleep(ttl_s / 3)
        try:
            await in_thread(sources.claim, keys, owner, ttl_s)
        except Exception as exc:  # the leases may lapse; the revision check still holds
            logger.warning("leases not renewed: %s", exc)


async def to_the_end(aw: Any) -> Any:
    """Await ``aw``; when cancelled, let it end first (threads cannot be stopped), then
    re-raise the cancellation."""
    fut = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await fut
        raise


async def in_thread(fn: Any, *args: Any) -> Any:
    """``asyncio.to_thread`` whose thread has ended when this returns, cancelled or not (a
    lease claimed by a thread still running after its batch gave the leases back would be
    held until it expires)."""
    return await to_the_end(asyncio.to_thread(fn, *args))


async def claim_leases(
    sources: SourceStore, keys: list[Key], owner: str, ttl_s: float, wait_s: float
) -> set[Key]:
    """The leases of ``keys`` that could be taken within ``wait_s`` (polling with backoff)."""
    held: set[Key] = await in_thread(sources.claim, keys, owner, ttl_s)
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while len(held) < len(keys) and time.monotonic() < deadline:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        missing = [k for k in keys if k not in held]
        held |= await in_thread(sources.claim, missing, owner, ttl_s)
    return held
