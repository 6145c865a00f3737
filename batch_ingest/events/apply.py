"""Applying a batch of events: per document the newest event wins, checked against the
registry's revision under the document's lease; one pipeline call for all upserts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from batch_ingest.events.envelope import InvalidEvent, MappedEvent
from batch_ingest.events.leases import (
    LEASE_TTL_S,
    LEASE_WAIT_S,
    claim_leases,
    renew_leases,
    to_the_end,
)
from batch_ingest.events.results import EventResult, invalid_result, result_of
from batch_ingest.ingest_report import IngestReport
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.source_store import Key
from deployments.errors import BackendUnavailable

logger = logging.getLogger(__name__)


async def apply_events(
    pipeline: IngestPipeline,
    events: list[MappedEvent | InvalidEvent],
    *,
    lease_ttl_s: float = LEASE_TTL_S,
    lease_wait_s: float = LEASE_WAIT_S,
) -> tuple[list[EventResult], list[str]]:
    """Apply a batch in revision order per document; one result per event, in input order,
    and the pipeline's degraded reasons.

    Per document only the newest event of the batch is applied, and only when it is newer
    than the registry's revision (``pipeline.sources``; without a registry every event
    applies). All upserts go through one ``pipeline.ingest`` call (one embedding call).

    With a registry, each document's lease (``SourceStore.claim``) is held from the revision
    check to the registry write, so two writers of one document apply its events one after
    the other; a document still leased by another writer after ``lease_wait_s`` is
    ``failed`` ("busy", retried on redelivery). An upsert whose graph write failed is
    ``failed`` as well (its chunks are searchable, ``searchable`` says so): the registry keeps
    the old revision, so the redelivery is applied again and retries the graph. So is one
    whose registry write failed (an upsert or a delete): acked, the registry would not know
    it and the revision guard would not hold; the redelivery records it.

    Raises:
        BackendUnavailable: Milvus or the embedder failed before anything was written.
    """
    results: list[EventResult | None] = [None] * len(events)
    winners: dict[Key, int] = {}
    for i, ev in enumerate(events):
        if isinstance(ev, InvalidEvent):
            results[i] = invalid_result(ev)
            continue
        best = winners.get(ev.key)
        if best is None or ev.revision > _mapped(events, best).revision:
            winners[ev.key] = i
    for i, ev in enumerate(events):
        if isinstance(ev, MappedEvent) and winners[ev.key] != i:
            newest = events[winners[ev.key]]
            assert isinstance(newest, MappedEvent)
            results[i] = result_of(
                ev, "unchanged" if ev.revision == newest.revision else "skipped_stale"
            )

    sources = pipeline.sources
    if sources is None or not winners:
        return await _apply_winners(pipeline, events, winners, results)
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    keys = list(winners)
    try:
        # Cancelled mid-batch (consumer stopped or killed), its claims and writes still run
        # on in threads that cannot be stopped: they end before the leases are given back (a
        # lease released under a running claim or write would not protect anything). The
        # batch is not acked; its redelivery finds what was written.
        return await to_the_end(
            _leased_apply(pipeline, events, winners, results, owner, lease_ttl_s, lease_wait_s)
        )
    finally:
        # Synchronous on purpose: a cancelled batch must still give its leases back, or its
        # documents would wait out the lease TTL. Only this batch's (owner's) rows go.
        try:
            sources.release(keys, owner)
        except Exception as exc:  # expires after lease_ttl_s anyway
            logger.warning("leases not released (they expire): %s", exc)


async def _leased_apply(
    pipeline: IngestPipeline,
    events: list[MappedEvent | InvalidEvent],
    winners: dict[Key, int],
    results: list[EventResult | None],
    owner: str,
    ttl_s: float,
    wait_s: float,
) -> tuple[list[EventResult], list[str]]:
    """Claim the winners' leases, fail the documents still busy, apply the rest while the
    held leases are renewed."""
    sources = pipeline.sources
    assert sources is not None
    held = await claim_leases(sources, list(winners), owner, ttl_s, wait_s)
    for key in [k for k in winners if k not in held]:
        i = winners.pop(key)
        ev = events[i]
        assert isinstance(ev, MappedEvent)
        results[i] = result_of(
            ev,
            "failed",
            error=f"busy: another writer is applying {'/'.join(key)}; retry later",
            retryable=True,
        )
    renew = asyncio.ensure_future(renew_leases(sources, list(held), owner, ttl_s))
    try:
        return await _apply_winners(pipeline, events, winners, results)
    finally:
        renew.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renew  # its claim thread, if one runs, ends first


async def _apply_winners(
    pipeline: IngestPipeline,
    events: list[MappedEvent | InvalidEvent],
    winners: dict[Key, int],
    results: list[EventResult | None],
) -> tuple[list[EventResult], list[str]]:
    sources = pipeline.sources
    upserts: list[int] = []
    deletes: list[int] = []
    for key, i in winners.items():
        ev = events[i]
        assert isinstance(ev, MappedEvent)
        if sources is not None:
            row = await asyncio.to_thread(sources.get, key)
            if row is not None and row.version is not None and ev.revision <= row.version:
                results[i] = result_of(
                    ev, "unchanged" if ev.revision == row.version else "skipped_stale"
                )
                continue
        (deletes if ev.action == "delete" else upserts).append(i)

    degraded: list[str] = []
    if upserts:
        upserted = [_mapped(events, i) for i in upserts]
        docs = [ev.document for ev in upserted if ev.document is not None]
        versions = {ev.key: ev.revision for ev in upserted}
        report = await pipeline.ingest(docs, versions)
        degraded += report.degraded
        by_key = {(r.team_id, r.doc_type, r.doc_id): r for r in report.results}
        for i in upserts:
            ev = events[i]
            assert isinstance(ev, MappedEvent)
            r = by_key.get(ev.key)
            if r is None:
                results[i] = result_of(ev, "failed", error="no result from the pipeline")
            elif r.status != "failed" and pipeline.graph is not None and not r.graph:
                results[i] = result_of(
                    ev,
                    "failed",
                    chunks=r.chunks,
                    removed_chunks=r.removed_chunks,
                    # Announced once: not again when a redelivery's graph write fails too.
                    searchable=r.written,
                    error="chunks indexed but the graph was not updated; "
                    "a redelivery retries the graph",
                    retryable=True,
                )
            else:
                results[i] = result_of(
                    ev,
                    r.status,
                    chunks=r.chunks,
                    removed_chunks=r.removed_chunks,
                    graph=r.graph,
                    searchable=r.written,
                    error=r.error,
                    retryable=r.retryable,
                )
    if deletes:
        deleted = [_mapped(events, i) for i in deletes]
        keys = [ev.key for ev in deleted]
        versions = {ev.key: ev.revision for ev in deleted}
        removed: IngestReport | None
        try:
            removed = await pipeline.delete(keys, versions)
        except BackendUnavailable as exc:
            removed = None
            error = exc.message
        if removed is not None:
            degraded += removed.degraded
            by_key = {(r.team_id, r.doc_type, r.doc_id): r for r in removed.results}
        for i in deletes:
            ev = events[i]
            assert isinstance(ev, MappedEvent)
            r = by_key.get(ev.key) if removed is not None else None
            if r is None:
                results[i] = result_of(
                    ev,
                    "failed",
                    error=error if removed is None else "no result",
                    retryable=removed is None,  # the backend was unavailable
                )
            else:
                results[i] = result_of(
                    ev,
                    "deleted" if r.status == "deleted" else "failed",
                    removed_chunks=r.removed_chunks,
                    graph=r.graph,
                    error=r.error,
                    retryable=r.retryable,
                )
    return [r for r in results if r is not None], degraded


def _mapped(events: list[MappedEvent | InvalidEvent], i: int) -> MappedEvent:
    """``events[i]``, which the caller knows is valid (a winner, an upsert or a delete)."""
    ev = events[i]
    assert isinstance(ev, MappedEvent)
    return ev
