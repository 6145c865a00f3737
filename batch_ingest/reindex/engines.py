"""Where a reindex's batches run: ``run_ray`` (a Ray Data actor pool, results streamed back
to the driver) or ``run_local`` (the same worker in-process); each finished batch goes to a
``BatchSink``. The bulk import (batch_ingest/bulk/) runs its own worker on the same engines."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from batch_ingest.reindex.options import ReindexError, ReindexOptions
from batch_ingest.reindex.pool import PoolWorker
from batch_ingest.reindex.private_ray import init_ray
from deployments.priority import lower_priority

logger = logging.getLogger("batch_ingest.reindex")

# Upper bound of Ray Data blocks of one job.
MAX_BLOCKS = 1000

BatchSink = Callable[[list[dict[str, Any]]], None]


class BatchWorker(Protocol):
    """What ``run_local`` runs: ``ReindexWorker``, ``BulkWorker``."""

    def process(self, documents: list[str]) -> list[dict[str, Any]]: ...


def run_local(worker: BatchWorker, documents: list[str], batch_size: int, sink: BatchSink) -> None:
    for start in range(0, len(documents), batch_size):
        sink(worker.process(documents[start : start + batch_size]))


def cpu_shortage(needed: float, free: float, total: float) -> str | None:
    """Why an actor pool needing ``needed`` CPUs cannot start now, or ``None`` if it can."""
    if free + 1e-9 >= needed:
        return None
    if total + 1e-9 < needed:
        return (
            f"waiting for CPUs: the actor pool needs {needed:g} and the whole cluster has "
            f"{total:g}; it starts only when nodes join (lower reindex.actors or "
            f"reindex.num_cpus_per_actor)"
        )
    return (
        f"waiting for CPUs: the actor pool needs {needed:g}, {free:g} of the cluster's "
        f"{total:g} are free (Serve replicas or other jobs hold the rest); it starts when they "
        f"are released (or lower reindex.actors or reindex.num_cpus_per_actor)"
    )


def resource_shortage(
    needed: dict[str, float], free: dict[str, float], total: dict[str, float]
) -> str | None:
    """Why a pool needing custom resources ``needed`` cannot start now, or ``None``."""
    for name, amount in sorted(needed.items()):
        have, whole = free.get(name, 0.0), total.get(name, 0.0)
        if have + 1e-9 >= amount:
            continue
        if whole + 1e-9 < amount:
            return (
                f"waiting for resource {name!r}: the actor pool needs {amount:g} and the "
                f"cluster's nodes offer {whole:g}; it starts when a node started with "
                f"`ray start --resources '{{\"{name}\": N}}'` joins (reindex.actor_resources)"
            )
        return (
            f"waiting for resource {name!r}: the actor pool needs {amount:g}, {have:g} of "
            f"{whole:g} are free; it starts when they are released"
        )
    return None


def _shortage(options: ReindexOptions) -> str | None:
    """Why the actor pool cannot be placed on the cluster now (``None``: it can)."""
    import ray

    needed = options.actors * options.num_cpus_per_actor
    free, total = ray.available_resources(), ray.cluster_resources()
    return cpu_shortage(
        needed, float(free.get("CPU", 0.0)), float(total.get("CPU", 0.0))
    ) or resource_shortage(
        {k: v * options.actors for k, v in options.actor_resources.items()}, free, total
    )


def wait_for_resources(
    options: ReindexOptions, on_note: Callable[[str | None], None] | None
) -> None:
    """Wait (at most ``options.resource_wait_s``) until the actor pool fits the cluster's free
    resources, saying why in the job's note at once; raise ``ReindexError`` naming what is
    missing when it still does not fit. The note stays until the first batch arrives."""
    deadline = time.monotonic() + options.resource_wait_s
    said: str | None = None
    while (note := _shortage(options)) is not None:
        if note != said:
            logger.warning("reindex: %s", note)
            if on_note is not None:
                on_note(note)
            said = note
        if time.monotonic() >= deadline:
            raise ReindexError(
                f"{note.replace('waiting for', 'gave up waiting for', 1)}; waited "
                f"{options.resource_wait_s:g}s (reindex.resource_wait_s)"
            )
        time.sleep(min(1.0, max(options.log_every_s, 0.1)))
    if said is not None:
        logger.info("reindex: the actor pool fits now")


def run_ray(
    spec: dict[str, Any],
    worker_args: tuple[Any, ...],
    documents: list[str],
    options: ReindexOptions,
    sink: BatchSink,
    on_note: Callable[[str | None], None] | None = None,
    *,
    worker: type = PoolWorker,
) -> None:
    """The Ray Data job: ``from_items`` (blocks made in the driver) ``→ map_batches`` (the
    actor pool of ``worker``, built with ``(spec, *worker_args)``); results stream back to the
    driver, which records them. ``worker_args``: ``ReindexWorker``'s ``(physical,
    check_existing, source)``; the bulk import passes its own ``worker``. No operator asks
    for a whole CPU (a repartition's tasks would, and on the shipped one-machine setup the
    Serve replicas hold more than one of its two: the job waited for ever); the actors ask
    for ``options.num_cpus_per_actor``.

    Before the pool exists it waits for the cluster's free CPUs (``wait_for_resources``:
    the job row's note says what is missing, within a second; bounded); a log line says every
    ``options.log_every_s`` that no batch came yet, until the first one arrives, when
    ``on_note(None)`` clears the note."""
    if options.driver_nice:
        # Before the Ray Data imports and the pool's start (the admin API's task only).
        lower_priority(options.driver_nice)
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    if not ray.is_initialized():
        # On a cluster RAY_ADDRESS names it; on a laptop a private local instance starts,
        # its files under var/ray/ (batch_ingest/reindex/private_ray.py).
        init_ray()
    wait_for_resources(options, on_note)
    first = threading.Event()
    started = time.perf_counter()

    def remind() -> None:
        while not first.wait(options.log_every_s):
            logger.info(
                "reindex: no batch yet after %.0fs (the actors are starting)",
                time.perf_counter() - started,
            )

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = False
    # One block per batch (results, progress and the done records arrive per block), at least
    # 4 per actor so every actor has work queued, at most MAX_BLOCKS.
    per_batch = math.ceil(len(documents) / options.batch_size)
    blocks = max(1, min(per_batch, max(options.actors * 4, MAX_BLOCKS)))
    # Custom resources place the actors on the nodes that offer them (ray_remote_args).
    extra: dict[str, Any] = (
        {"resources": dict(options.actor_resources)} if options.actor_resources else {}
    )
    ds = ray.data.from_items(
        [{"document": d} for d in documents], override_num_blocks=blocks
    ).map_batches(
        worker,
        fn_constructor_args=(spec, *worker_args),
        batch_size=options.batch_size,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=options.actors),
        num_cpus=options.num_cpus_per_actor,
        **extra,
    )
    threading.Thread(target=remind, name="reindex-wait", daemon=True).start()
    try:
        _drain(ds, sink, first, on_note)
    finally:
        first.set()


def _drain(
    ds: Any, sink: BatchSink, first: threading.Event, on_note: Callable[[str | None], None] | None
) -> None:
    """Hand each result batch of ``ds`` to ``sink`` as rows of plain Python values; the first
    one sets ``first`` and clears the job's note."""
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        if not first.is_set():
            first.set()
            if on_note is not None:
                on_note(None)
        n = len(batch["doc_id"])
        sink([{key: _plain(column[i]) for key, column in batch.items()} for i in range(n)])


def _plain(value: Any) -> Any:
    """A numpy scalar of a result column as its Python value (``str``, ``int``)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value
