"""``reindex(team_id)``: re-chunk and re-embed one tenant into a new collection version, then
swap its alias — searches never see a half-built index.

    python -m batch_ingest.reindex --team dao_greenfood [--resume] [--actors 2] [--batch-size 32]

Steps (a job row in the state database, ``batch_ingest.reindex_state``, records each one):

1. The team's alias ``<base>__<slug>`` points to ``__v<n>``; create ``__v<n+1>`` with the same
   schema and indexes (``MilvusStore.create_version``).
2. Read the team's live documents from the source registry (``SourceStore``); re-chunk them
   with the current chunker and embed them with the current embedder settings in a Ray Data
   actor pool (``map_batches`` over a callable class holding the model, fractional CPUs,
   ``repartition`` so blocks spread over the actors); each batch is upserted into ``__v<n+1>``
   by the actor and recorded as done by the driver.
3. Catch up on documents ingested or deleted while the job ran (``SourceStore.changed_since``).
4. Verify: rows in ``__v<n+1>`` == the chunk count the re-chunking produced, and no row has an
   ``embed_model`` other than the current tag. A mismatch fails the job; the alias is untouched.
5. ``alter_alias`` to ``__v<n+1>`` (one atomic call), catch up once more on writes that reached
   ``__v<n>`` during the checks, then drop the old version (``--keep-previous`` keeps exactly
   one previous version for rollback instead).

``--resume`` continues the team's unfinished job into the same target version: recorded
documents are skipped outright; the others are re-chunked and looked up by their deterministic
chunk ids in the target, and only those missing or different are embedded again.

Without Ray (``--engine local``) the same worker runs in-process, batch after batch.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from batch_ingest.documents import SourceDocument, make_chunk_id
from batch_ingest.reindex_state import JobStatus, ReindexJob, ReindexState
from batch_ingest.settings import BatchSettings, ReindexSettings
from batch_ingest.source_store import SourceStore
from deployments.errors import GatewayError
from deployments.protocols import ChunkRecord

logger = logging.getLogger("batch_ingest.reindex")

# An active job whose row was not updated for this long is taken as dead (its process gone).
STALE_AFTER_S = 120.0
# Upper bound of Ray Data blocks of one job.
MAX_BLOCKS = 1000
# BatchSettings overrides (JSON) of a job started by the admin API as a subprocess.
SETTINGS_ENV = "RAG_REINDEX_SETTINGS"


class ReindexError(GatewayError):
    """The job cannot start, or its verification failed (the alias was not switched)."""

    code = "reindex_failed"


_DEFAULTS = ReindexSettings()


@dataclass
class ReindexOptions:
    """One run of a job. The pool and version options default to ``ReindexSettings``
    (``REINDEX__*``; ``from_settings`` reads a configured section)."""

    team_id: str
    resume: bool = False
    # Documents per map_batches call (each call embeds all their chunks in one forward loop).
    batch_size: int = _DEFAULTS.batch_size
    actors: int = _DEFAULTS.actors
    # Fractional: whole CPUs let the actors take every core and starve Ray Data's read tasks.
    num_cpus_per_actor: float = _DEFAULTS.num_cpus_per_actor
    engine: Literal["ray", "local"] = "ray"
    keep_previous: bool = _DEFAULTS.keep_previous
    # Continue this (queued) job, e.g. one the admin API created.
    job_id: str | None = None
    log_every_s: float = 5.0
    # Catch-up looks this much further back than the job's own clock says (the registry rows
    # are stamped by the writers' clocks), and waits this long after the alias switch so an
    # ingestion that wrote to the old version has recorded its document before the last look.
    clock_skew_s: float = 5.0
    switch_grace_s: float = 2.0

    @classmethod
    def from_settings(cls, team_id: str, cfg: ReindexSettings, **given: Any) -> ReindexOptions:
        """Options for ``team_id`` with the pool and version options of ``cfg``; ``given``
        (``None`` values ignored) overrides any of them."""
        base = {
            "batch_size": cfg.batch_size,
            "actors": cfg.actors,
            "num_cpus_per_actor": cfg.num_cpus_per_actor,
            "keep_previous": cfg.keep_previous,
        }
        return cls(team_id=team_id, **{**base, **{k: v for k, v in given.items() if v is not None}})


@dataclass
class ReindexResult:
    job: ReindexJob
    dropped_versions: list[int] = field(default_factory=list)
    took_s: float = 0.0


# --- the worker (one per Ray actor, or one in-process) ----------------------------------------
def worker_spec(settings: BatchSettings) -> dict[str, Any]:
    """The settings a worker needs, as plain data (no secrets of other sections)."""
    return {
        "embedder": settings.embedder.model_dump(),
        "milvus": settings.milvus.model_dump(),
        "chunking": settings.chunking.model_dump(),
    }


class ReindexWorker:
    """Callable class for ``Dataset.map_batches``: holds the chunker, the model and a Milvus
    connection; each call re-chunks a batch of documents, embeds what the target lacks and
    upserts it into the target physical collection.

    Args:
        spec: ``worker_spec(settings)``.
        physical: the target collection (``<alias>__v<n+1>``).
        check_existing: look chunk ids up in the target first (resume): a document whose
            chunks are all there with the same hash and model is not embedded again.
        store, embed, builder: injected by tests; built from ``spec`` when ``None``.
    """

    def __init__(
        self,
        spec: dict[str, Any],
        physical: str,
        check_existing: bool,
        *,
        store: Any = None,
        embed: Callable[[list[str]], Any] | None = None,
        builder: Any = None,
    ) -> None:
        from batch_ingest.chunks import chunk_builder
        from batch_ingest.settings import ChunkingSettings
        from deployments.config import EmbedderSettings, MilvusSettings

        emb = EmbedderSettings.model_validate(spec["embedder"])
        self.physical = physical
        self.check_existing = check_existing
        self.embed_model = emb.embed_model_tag
        if builder is None:
            builder = chunk_builder(ChunkingSettings.model_validate(spec["chunking"]), emb)
        self.builder = builder
        if embed is None:
            from deployments.embedding import EmbedderCore

            core = EmbedderCore(emb)
            core.start()
            embed = lambda texts: core.embed(texts, "passage")  # noqa: E731
            dim = core.dim or 0
        else:
            dim = None
        self.embed = embed
        if store is None:
            from deployments.milvus_store import MilvusStore

            store = MilvusStore(MilvusSettings.model_validate(spec["milvus"]), dim=dim or 0)
            store.start()
        self.store = store

    def process(self, documents: Iterable[str]) -> list[dict[str, Any]]:
        """Per document: ``{doc_type, doc_id, chunks, embedded}``, in input order."""
        docs = [SourceDocument.model_validate_json(d) for d in documents]
        built = [(doc, self.builder.build_chunks(doc)) for doc in docs]
        found: dict[str, tuple[str, str]] = {}
        if self.check_existing:
            ids = [c.chunk_id for _, chunks in built for c in chunks]
            found = self.store.lookup_in(self.physical, ids) if ids else {}
        todo: list[ChunkRecord] = []
        out = []
        for doc, chunks in built:
            present = bool(found) and all(
                found.get(c.chunk_id) == (c.content_hash, c.embed_model) for c in chunks
            )
            if not present:
                todo += chunks
            out.append(
                {
                    "doc_type": doc.doc_type,
                    "doc_id": doc.doc_id,
                    "chunks": len(chunks),
                    "embedded": 0 if present else len(chunks),
                }
            )
        if todo:
            vectors = self.embed([c.text for c in todo])
            with_vectors = [
                replace(c, vector=[float(x) for x in v]) for c, v in zip(todo, vectors, strict=True)
            ]
            self.store.upsert_into(self.physical, with_vectors)
        return out

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        rows = self.process([str(d) for d in batch["document"]])
        return {key: [r[key] for r in rows] for key in ("doc_type", "doc_id", "chunks", "embedded")}


# --- engines -----------------------------------------------------------------------------------
BatchSink = Callable[[list[dict[str, Any]]], None]


def run_local(worker: ReindexWorker, documents: list[str], batch_size: int, sink: BatchSink):
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


def run_ray(
    spec: dict[str, Any],
    physical: str,
    check_existing: bool,
    documents: list[str],
    options: ReindexOptions,
    sink: BatchSink,
    on_note: Callable[[str | None], None] | None = None,
) -> None:
    """The Ray Data job: ``from_items → repartition → map_batches(actor pool)``; results
    stream back to the driver, which records them.

    Before the pool exists it checks the cluster's free CPUs: if the actors cannot be
    placed, ``on_note`` gets the reason (the job row shows it) and a log line repeats it every
    ``options.log_every_s`` until the first batch arrives, when ``on_note(None)`` clears it."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    if not ray.is_initialized():
        # On a cluster RAY_ADDRESS names it; on a laptop a local instance starts.
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or "local",
            include_dashboard=False,
            log_to_driver=False,
        )
    needed = options.actors * options.num_cpus_per_actor
    note = cpu_shortage(
        needed,
        float(ray.available_resources().get("CPU", 0.0)),
        float(ray.cluster_resources().get("CPU", 0.0)),
    )
    if note is not None:
        logger.warning("reindex: %s", note)
        if on_note is not None:
            on_note(note)
    first = threading.Event()
    started = time.perf_counter()

    def remind() -> None:
        while not first.wait(options.log_every_s):
            logger.info(
                "reindex: no batch yet after %.0fs%s",
                time.perf_counter() - started,
                f" ({note})" if note else " (actors loading the model)",
            )

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = False
    # One block per batch (results, progress and the done records arrive per block), at least
    # 4 per actor so every actor has work queued, at most MAX_BLOCKS.
    per_batch = math.ceil(len(documents) / options.batch_size)
    blocks = max(1, min(per_batch, max(options.actors * 4, MAX_BLOCKS)))
    ds = (
        ray.data.from_items([{"document": d} for d in documents])
        .repartition(blocks)
        .map_batches(
            ReindexWorker,
            fn_constructor_args=(spec, physical, check_existing),
            batch_size=options.batch_size,
            batch_format="numpy",
            compute=ActorPoolStrategy(size=options.actors),
            num_cpus=options.num_cpus_per_actor,
        )
    )
    threading.Thread(target=remind, name="reindex-wait", daemon=True).start()
    try:
        _drain(ds, sink, first, on_note)
    finally:
        first.set()


def _drain(
    ds: Any, sink: BatchSink, first: threading.Event, on_note: Callable[[str | None], None] | None
) -> None:
    """Hand each result batch of ``ds`` to ``sink``; the first one sets ``first`` and clears
    the job's note."""
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        if not first.is_set():
            first.set()
            if on_note is not None:
                on_note(None)
        n = len(batch["doc_id"])
        sink(
            [
                {
                    "doc_type": str(batch["doc_type"][i]),
                    "doc_id": str(batch["doc_id"][i]),
                    "chunks": int(batch["chunks"][i]),
                    "embedded": int(batch["embedded"][i]),
                }
                for i in range(n)
            ]
        )


# --- the job -----------------------------------------------------------------------------------
class _Progress:
    """Logs done/total documents, chunks, rate (chunks/s) and ETA; saves them on the job."""

    def __init__(self, job: ReindexJob, state: ReindexState, every_s: float) -> None:
        self.job, self.state, self.every_s = job, state, every_s
        self.started = time.perf_counter()
        self.start_docs = job.done_docs
        self.chunks = 0
        self.last = self.started

    def add(self, docs: int, chunks: int) -> None:
        self.job.done_docs += docs
        self.chunks += chunks
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.job.done_docs >= self.job.total_docs:
            self.last = now
            self.report()

    def report(self) -> None:
        job = self.job
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        job.rate_chunks_s = round(self.chunks / elapsed, 2)
        docs_rate = (job.done_docs - self.start_docs) / elapsed
        left = max(job.total_docs - job.done_docs, 0)
        job.eta_s = round(left / docs_rate, 1) if docs_rate > 0 else None
        logger.info(
            "reindex %s: %d/%d docs (%.0f%%), %d chunks written, %.1f chunks/s, ETA %s",
            job.team_id,
            job.done_docs,
            job.total_docs,
            100.0 * job.done_docs / max(job.total_docs, 1),
            job.written_chunks,
            job.rate_chunks_s,
            f"{job.eta_s:.0f}s" if job.eta_s is not None else "?",
        )
        self.state.save(job)


class Reindexer:
    """Runs one team's reindex job (see the module docstring).

    Args:
        settings: the gateway settings (current embedder, chunking, Milvus, state database).
        store: a started ``MilvusStore`` (or a test double with the same version methods).
        sources: the source registry; ``state``: job records (default: its database).
        worker_factory: ``(physical, check_existing) -> ReindexWorker`` for the local engine
            (tests inject one with fakes).
        wrap_sink: wraps the sink that records each finished batch (tests inject a crash
            there); ``None`` records as it is.
    """

    def __init__(
        self,
        settings: BatchSettings,
        *,
        store: Any = None,
        sources: SourceStore | None = None,
        state: ReindexState | None = None,
        worker_factory: Callable[[str, bool], ReindexWorker] | None = None,
        wrap_sink: Callable[[BatchSink], BatchSink] | None = None,
    ) -> None:
        self.settings = settings
        self.wrap_sink = wrap_sink
        self.sources = sources or SourceStore(settings.state.url)
        self.state = state or ReindexState(self.sources.engine)
        if store is None:
            from deployments.embedding import embedding_dim
            from deployments.milvus_store import MilvusStore

            store = MilvusStore(settings.milvus, dim=embedding_dim(settings.embedder))
            store.start()
        self.store = store
        self.spec = worker_spec(settings)
        self.worker_factory = worker_factory or (
            lambda physical, check: ReindexWorker(self.spec, physical, check)
        )
        self._local_worker: tuple[str, bool, ReindexWorker] | None = None

    # --- job selection -----------------------------------------------------------------------
    def _job(self, options: ReindexOptions) -> ReindexJob:
        team = options.team_id
        unfinished = self.state.unfinished(team)
        if options.job_id:
            job = self.state.get(options.job_id)
            if job is None or job.team_id != team:
                raise ReindexError(f"no reindex job {options.job_id} for team {team!r}")
            others = [j for j in unfinished if j.job_id != job.job_id]
        elif options.resume:
            if not unfinished:
                raise ReindexError(f"team {team!r} has no unfinished reindex job to resume")
            job, others = unfinished[0], unfinished[1:]
        else:
            job, others = None, unfinished
        now = datetime.now(UTC)
        for old in others:
            # An abandoned attempt: its half-built version is not live; drop it.
            age = (now - old.updated_at).total_seconds() if old.updated_at else math.inf
            if old.status in (JobStatus.QUEUED, JobStatus.RUNNING) and age < STALE_AFTER_S:
                raise ReindexError(
                    f"job {old.job_id} of team {team!r} is {old.status} (updated {age:.0f}s "
                    "ago); wait for it, or resume it once it has stopped"
                )
            if old.status == JobStatus.SWITCHING:
                raise ReindexError(
                    f"job {old.job_id} of team {team!r} was switching its alias; "
                    "resume it (--resume) before starting another"
                )
            old.move_to(JobStatus.SUPERSEDED, f"superseded by a newer job of {team!r}")
            old.finished_at = datetime.now(UTC)
            self.state.save(old)
            if old.target_version is not None and old.target_version != (
                self.store.current_version(team)
            ):
                self.store.drop_version(team, old.target_version)
            self.state.forget(old.job_id)
        if job is None:
            job = self.state.create(team, {"actors": options.actors, "engine": options.engine})
        return job

    # --- the run -------------------------------------------------------------------------------
    def run(self, options: ReindexOptions) -> ReindexResult:
        if self.settings.milvus.layout != "collection_per_team":
            raise ReindexError(
                "reindex needs MILVUS__LAYOUT=collection_per_team (a shared collection holds "
                "every team; one team cannot be swapped on its own)"
            )
        started = time.perf_counter()
        team = options.team_id
        job = self._job(options)
        tag = self.settings.embedder.embed_model_tag
        try:
            return self._run(job, options, tag, started)
        except BaseException as exc:
            if not job.finished:  # a failure after success was recorded changes nothing
                job.move_to(JobStatus.FAILED, f"{type(exc).__name__}: {exc}")
                job.finished_at = datetime.now(UTC)
                self.state.save(job)
            logger.error("reindex %s (job %s) failed: %s", team, job.job_id, job.error)
            raise

    def _run(
        self, job: ReindexJob, options: ReindexOptions, tag: str, started: float
    ) -> ReindexResult:
        team = options.team_id
        store = self.store
        current = store.current_version(team)
        resuming = job.target_version is not None
        if resuming and current == job.target_version:
            # Crashed after the switch: only the last catch-up and the clean-up are left.
            physical = store.physical_name(team, job.target_version)
            done = self.state.done(job.job_id)
            sink = self._sink(job, done, None, options)
            self._catch_up(job, done, physical, job.snapshot_at, options, sink)
            job.expected_chunks = sum(done.values())
            return self._finish(job, options, started)
        if not resuming:
            existing = store.versions(team)
            job.source_version = current
            job.target_version = max([*existing, current or 0]) + 1
            job.snapshot_at = datetime.now(UTC)
        job.embed_model = tag
        job.move_to(JobStatus.RUNNING)
        job.finished_at = None
        physical = store.create_version(team, job.target_version)
        self.state.save(job)
        logger.info(
            "reindex %s: v%s → v%s (%s), job %s%s",
            team,
            job.source_version,
            job.target_version,
            physical,
            job.job_id,
            " (resumed)" if resuming else "",
        )

        done = self.state.done(job.job_id)
        documents = list(self.sources.iter_team(team))
        job.total_docs = len(documents)
        pending = [d for d in documents if (d.doc_type, d.doc_id) not in done]
        job.done_docs = job.total_docs - len(pending)
        job.skipped_docs = 0
        progress = _Progress(job, self.state, options.log_every_s)
        progress.report()
        sink = self._sink(job, done, progress, options)
        self._process(
            [d.model_dump_json() for d in pending],
            physical,
            resuming,
            options,
            sink,
            self._noter(job),
        )
        progress.report()

        # Documents written or deleted while the bulk pass ran.
        catchup_from = datetime.now(UTC)
        self._catch_up(job, done, physical, job.snapshot_at, options, sink)

        # Verify before anything is visible.
        store.flush_physical(physical)
        job.expected_chunks = sum(done.values())
        job.rows_in_target = store.count_in(physical)
        from deployments.search_filter import milvus_literal

        other = store.count_in(physical, f"embed_model != {milvus_literal(tag)}")
        if job.rows_in_target != job.expected_chunks or other:
            raise ReindexError(
                f"verification failed for {physical}: {job.rows_in_target} rows, expected "
                f"{job.expected_chunks}; {other} rows not embedded with {tag}"
            )
        job.move_to(JobStatus.SWITCHING)
        self.state.save(job)
        store.switch_alias(team, job.target_version)
        # Writes that reached the old version between the catch-up and the switch.
        time.sleep(options.switch_grace_s)
        self._catch_up(job, done, physical, catchup_from, options, sink)
        job.expected_chunks = sum(done.values())
        return self._finish(job, options, started)

    def _finish(self, job: ReindexJob, options: ReindexOptions, started: float) -> ReindexResult:
        team = job.team_id
        dropped = []
        for version in self.store.versions(team):
            if version == job.target_version:
                continue
            if options.keep_previous and version == job.source_version:
                continue
            if self.store.drop_version(team, version):
                dropped.append(version)
        job.move_to(JobStatus.SUCCEEDED)
        job.eta_s = 0.0
        job.finished_at = datetime.now(UTC)
        self.state.save(job)
        self.state.forget(job.job_id)
        took = time.perf_counter() - started
        logger.info(
            "reindex %s done: v%s live, %d docs, %d chunks (verified), dropped %s, %.1fs",
            team,
            job.target_version,
            job.total_docs,
            job.expected_chunks,
            dropped or "nothing",
            took,
        )
        return ReindexResult(job=job, dropped_versions=dropped, took_s=round(took, 2))

    def _sink(
        self,
        job: ReindexJob,
        done: dict[tuple[str, str], int],
        progress: _Progress | None,
        options: ReindexOptions,
    ) -> BatchSink:
        team = job.team_id

        def sink(rows: list[dict[str, Any]]) -> None:
            batch: dict[tuple[str, str], int] = {}
            stale: list[str] = []
            for r in rows:
                key = (r["doc_type"], r["doc_id"])
                before = done.get(key)
                # A document that shrank (changed during the job) leaves chunk ids behind.
                if before is not None and before > r["chunks"]:
                    stale += [
                        make_chunk_id(team, key[0], key[1], i) for i in range(r["chunks"], before)
                    ]
                batch[key] = r["chunks"]
                job.written_chunks += r["embedded"]
                if not r["embedded"]:
                    job.skipped_docs += 1
            if stale:
                physical = self.store.physical_name(team, job.target_version)
                self.store.delete_in(physical, stale)
            self.state.mark_done(job.job_id, batch)
            new = sum(1 for k in batch if k not in done)
            done.update(batch)
            if progress is not None:
                progress.add(new, sum(r["embedded"] for r in rows))

        return sink if self.wrap_sink is None else self.wrap_sink(sink)

    def _noter(self, job: ReindexJob) -> Callable[[str | None], None]:
        """Records what ``job`` waits on (``None``: nothing) in its row at once."""

        def note(text: str | None) -> None:
            if job.note != text:
                job.note = text
                self.state.save(job)

        return note

    def _process(
        self,
        documents: list[str],
        physical: str,
        check_existing: bool,
        options: ReindexOptions,
        sink: BatchSink,
        on_note: Callable[[str | None], None] | None = None,
    ) -> None:
        if not documents:
            return
        if options.engine == "ray":
            run_ray(self.spec, physical, check_existing, documents, options, sink, on_note)
            return
        cached = self._local_worker
        if cached is None or cached[:2] != (physical, check_existing):
            cached = (physical, check_existing, self.worker_factory(physical, check_existing))
            self._local_worker = cached
        run_local(cached[2], documents, options.batch_size, sink)

    def _catch_up(
        self,
        job: ReindexJob,
        done: dict[tuple[str, str], int],
        physical: str,
        since: datetime | None,
        options: ReindexOptions,
        sink: BatchSink,
    ) -> None:
        if since is None:
            return
        rows = self.sources.changed_since(
            job.team_id, since - timedelta(seconds=options.clock_skew_s)
        )
        live = [r.document for r in rows if not r.deleted and r.document is not None]
        gone = [
            (r.doc_type, r.doc_id) for r in rows if r.deleted and (r.doc_type, r.doc_id) in done
        ]
        if gone:
            ids = [make_chunk_id(job.team_id, k[0], k[1], i) for k in gone for i in range(done[k])]
            self.store.delete_in(physical, ids)
            self.state.unmark(job.job_id, gone)
            for key in gone:
                done.pop(key)
        if live:
            # Changed documents are re-embedded (no lookup: their text may have changed).
            job.total_docs = job.total_docs + sum(
                1 for d in live if (d.doc_type, d.doc_id) not in done
            )
            self._process(
                [d.model_dump_json() for d in live],
                physical,
                False,
                options,
                sink,
                self._noter(job),
            )
        if rows:
            logger.info(
                "reindex %s: caught up on %d changed and %d deleted documents",
                job.team_id,
                len(live),
                len(gone),
            )


def reindex(settings: BatchSettings, options: ReindexOptions, **kwargs: Any) -> ReindexResult:
    """Run one reindex job to the end (see ``Reindexer``)."""
    return Reindexer(settings, **kwargs).run(options)


def run_job(job_id: str, team_id: str, settings_overrides: dict[str, Any] | None = None) -> dict:
    """Entry point of a job the admin API submitted (a Ray task, or the CLI's ``--job-id``):
    settings from the environment of the process, plus ``settings_overrides``."""
    settings = BatchSettings(**(settings_overrides or {}))
    options = ReindexOptions.from_settings(team_id, settings.reindex, job_id=job_id)
    result = reindex(settings, options)
    return result.job.public()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batch_ingest.reindex", description=__doc__)
    parser.add_argument("--team", required=True, help="team_id to reindex")
    parser.add_argument("--milvus-uri", help="overrides MILVUS__URI")
    parser.add_argument("--state-url", help="overrides STATE__URL (source registry + jobs)")
    parser.add_argument("--resume", action="store_true", help="continue the unfinished job")
    parser.add_argument("--job-id", help="run this queued job (as submitted by the admin API)")
    parser.add_argument("--batch-size", type=int, help="documents per map_batches call")
    parser.add_argument("--actors", type=int, help="embedding actors in the Ray Data pool")
    parser.add_argument("--num-cpus", type=float, help="logical CPUs per actor (fractional)")
    parser.add_argument("--engine", choices=("ray", "local"), default="ray")
    parser.add_argument(
        "--keep-previous", action="store_true", help="keep the replaced version for rollback"
    )
    parser.add_argument("--log-every", type=float, default=5.0, help="seconds between log lines")
    parser.add_argument(
        "--settings-json", help="BatchSettings overrides as JSON (the admin API passes its own)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # The admin API passes its settings in the environment (not argv: `ps` shows argv).
    raw = args.settings_json or os.environ.get(SETTINGS_ENV)
    overrides: dict[str, Any] = json.loads(raw) if raw else {}
    if args.milvus_uri:
        overrides["milvus"] = {**overrides.get("milvus", {}), "uri": args.milvus_uri}
    if args.state_url:
        overrides["state"] = {**overrides.get("state", {}), "url": args.state_url}
    settings = BatchSettings(**overrides)
    options = ReindexOptions.from_settings(
        args.team,
        settings.reindex,
        resume=args.resume,
        job_id=args.job_id,
        batch_size=args.batch_size,
        actors=args.actors,
        num_cpus_per_actor=args.num_cpus,
        engine=args.engine,
        keep_previous=args.keep_previous or None,
        log_every_s=args.log_every,
    )
    try:
        result = reindex(settings, options)
    except ReindexError as exc:
        print(f"reindex failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({**result.job.public(), "dropped_versions": result.dropped_versions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
