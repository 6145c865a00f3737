"""``Reindexer``: one team's reindex job, step by step (see the package docstring)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from batch_ingest.generations import IndexGenerations
from batch_ingest.reindex.claim import claim_job
from batch_ingest.reindex.cleanup import drop_unusable_target, unresumable
from batch_ingest.reindex.engines import BatchSink
from batch_ingest.reindex.finish import JobFinish
from batch_ingest.reindex.heartbeat import Heartbeat
from batch_ingest.reindex.options import (
    ReindexError,
    ReindexOptions,
    ReindexResult,
    VerificationFailed,
)
from batch_ingest.reindex.progress import Progress
from batch_ingest.reindex.record import batch_sink, noter
from batch_ingest.reindex.state import JobStatus, ReindexJob, ReindexState
from batch_ingest.reindex.switch import VersionSwitch
from batch_ingest.reindex.team import require_known_team
from batch_ingest.reindex.worker import ReindexWorker, worker_spec
from batch_ingest.reindex.writer import TargetWriter
from batch_ingest.settings import BatchSettings
from batch_ingest.source_store import SourceStore
from batch_ingest.write_barrier import WriteBarrier
from deployments.vector_store.versions import CollectionVersions

logger = logging.getLogger("batch_ingest.reindex")


class Reindexer:
    """Runs one team's reindex job (see the module docstring).

    Args:
        settings: the gateway settings (embedder, chunking, Milvus, state database). During a
            change of model (``embedder_next`` set) the job embeds with the next model: the
            version it builds holds that model's vectors, noted on the collection.
        versions: the versioned collections of a started ``MilvusStore`` (``store.versions``;
            a test double with the same methods); default: a store of ``settings.milvus``.
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
        versions: CollectionVersions | None = None,
        sources: SourceStore | None = None,
        state: ReindexState | None = None,
        worker_factory: Callable[[str, bool], ReindexWorker] | None = None,
        wrap_sink: Callable[[BatchSink], BatchSink] | None = None,
    ) -> None:
        if settings.reindex_embedder is not settings.embedder:
            # Everything below (the workers' spec, the chunker's tokenizer, the tag) is the
            # next model's.
            settings = settings.model_copy(update={"embedder": settings.reindex_embedder})
        self.settings = settings
        self.wrap_sink = wrap_sink
        self.sources = sources or SourceStore(settings.state.url)
        self.state = state or ReindexState(self.sources.engine)
        # Raised at the swap: answers cached for the old version are stale.
        self.generations = IndexGenerations(self.sources.engine)
        if versions is None:
            from deployments.models.embedding import embedding_dim
            from deployments.vector_store.store import MilvusStore

            store = MilvusStore(
                settings.milvus,
                dim=embedding_dim(settings.embedder),
                lexical=settings.embedder.lexical,
            )
            store.start()
            versions = store.versions
        self.versions = versions
        self.spec = worker_spec(settings)
        self.writer = TargetWriter(
            self.spec,
            versions,
            self.sources,
            self.state,
            worker_factory or (lambda physical, check: ReindexWorker(self.spec, physical, check)),
        )
        # Pauses the team's writes for the last catch-up and the switch.
        self.barrier = WriteBarrier(self.sources.engine)
        self.switch = VersionSwitch(versions, self.writer, self.barrier, self.generations)
        self.finish = JobFinish(versions, self.sources, self.state, self.generations)

    # --- the run -------------------------------------------------------------------------------
    def run(self, options: ReindexOptions) -> ReindexResult:
        if self.settings.milvus.layout != "collection_per_team":
            raise ReindexError(
                "reindex needs MILVUS__LAYOUT=collection_per_team (a shared collection holds "
                "every team; one team cannot be swapped on its own)"
            )
        started = time.perf_counter()
        team = options.team_id
        if not (options.resume or options.job_id or options.allow_empty):
            require_known_team(team, self.sources, self.versions.current)
        job = claim_job(self.state, self.versions, options)
        tag = self.settings.embedder.embed_model_tag
        try:
            with Heartbeat(self.state, job, options.heartbeat_s):
                return self._run(job, options, tag, started)
        except BaseException as exc:
            if not job.finished:  # a failure after success was recorded changes nothing
                job.move_to(JobStatus.FAILED, f"{type(exc).__name__}: {exc}")
                job.eta_s = None
                if unresumable(exc):  # a failed verification: --resume cannot use the target
                    drop_unusable_target(self.state, self.versions, job)
                job.finished_at = datetime.now(UTC)
                self.state.save(job)
                self.switch.withdraw(team)
            logger.error("reindex %s (job %s) failed: %s", team, job.job_id, job.error)
            raise

    def _run(
        self, job: ReindexJob, options: ReindexOptions, tag: str, started: float
    ) -> ReindexResult:
        team = options.team_id
        versions = self.versions
        current = versions.current(team)
        target = job.target_version
        resuming = target is not None
        if target is not None and current == target:
            # Crashed after the switch: only the last catch-up and the clean-up are left.
            physical = versions.name(team, target)
            done = self.state.done(job.job_id)
            sink = self._sink(job, done, None, options)
            self.writer.source = None  # replaced already
            self.switch.run(
                job,
                done,
                physical,
                partial(
                    self._catch_up, job, done, physical, job.snapshot_at, options, sink, final=True
                ),
                options,
                sink,
            )
            job.expected_chunks = sum(done.values())
            return self.finish.run(job, options, started)
        if target is None:
            existing = versions.existing(team)
            job.source_version = current
            job.target_version = target = max([*existing, current or 0]) + 1
            job.snapshot_at = datetime.now(UTC)
        job.embed_model = tag
        self.writer.source = self.writer.source_of(job)
        job.move_to(JobStatus.RUNNING)
        job.finished_at = None
        physical = self._create(team, target)
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
        progress = Progress(job, self.state, options.log_every_s)
        progress.report()
        sink = self._sink(job, done, progress, options)
        bulk = options
        if options.engine == "ray" and self.writer.copies_only(tag):
            # Same model: the vectors are copied, no model loads; an actor pool would only
            # add its start-up to Milvus I/O.
            logger.info("reindex %s: the model is unchanged: copying vectors in-process", team)
            bulk = replace(options, engine="local")
        self._process(
            [d.model_dump_json() for d in pending],
            physical,
            resuming,
            bulk,
            sink,
            noter(job, self.state),
        )
        progress.report()
        # Replicas that search the team load the new version beside the old from here on,
        # so the switch finds it in memory (deployments/vector_store/memindex/staging.py).
        announced = self.switch.announce(job)

        # Documents written or deleted while the bulk pass ran (in-process too when the
        # model is unchanged: their vectors are reused, and an actor pool asked for here
        # could wait for CPUs the Serve replicas hold).
        catchup_from = datetime.now(UTC)
        self._catch_up(job, done, physical, job.snapshot_at, bulk, sink)

        # Verify before anything is visible.
        versions.flush(physical)
        job.expected_chunks = sum(done.values())
        job.rows_in_target = versions.count(physical)
        from deployments.vector_store.filter import milvus_literal

        other = versions.count(physical, f"embed_model != {milvus_literal(tag)}")
        if job.rows_in_target != job.expected_chunks or other:
            raise VerificationFailed(
                f"verification failed for {physical}: {job.rows_in_target} rows, expected "
                f"{job.expected_chunks}; {other} rows not embedded with {tag}"
            )
        job.move_to(JobStatus.SWITCHING)
        self.state.save(job)
        # Time for the replicas to load it (about 1 s per 500 rows measured on 2 cores).
        ready_at = announced + min(options.stage_max_s, job.rows_in_target / 500)
        time.sleep(max(0.0, ready_at - time.monotonic()))
        last = partial(self._catch_up, job, done, physical, catchup_from, options, sink, final=True)
        self.switch.run(job, done, physical, last, options, sink)
        return self.finish.run(job, options, started)

    def _create(self, team: str, version: int) -> str:
        """The target version, for the vectors of the model this job embeds with."""
        from deployments.models.embedding import embedding_dim

        emb = self.settings.embedder
        return self.versions.create(
            team,
            version,
            dim=embedding_dim(emb),
            embed_model=emb.embed_model_tag,
            lexical=emb.lexical,
        )

    def _sink(
        self,
        job: ReindexJob,
        done: dict[tuple[str, str], int],
        progress: Progress | None,
        options: ReindexOptions,
    ) -> BatchSink:
        """What records each finished batch (record.py), wrapped by ``wrap_sink``."""
        sink = batch_sink(job, done, progress, self.state, self.versions)
        return sink if self.wrap_sink is None else self.wrap_sink(sink)

    def _process(
        self,
        documents: list[str],
        physical: str,
        check_existing: bool,
        options: ReindexOptions,
        sink: BatchSink,
        on_note: Callable[[str | None], None] | None = None,
    ) -> None:
        self.writer.process(documents, physical, check_existing, options, sink, on_note)

    def _catch_up(
        self,
        job: ReindexJob,
        done: dict[tuple[str, str], int],
        physical: str,
        since: datetime | None,
        options: ReindexOptions,
        sink: BatchSink,
        *,
        final: bool = False,
    ) -> list[tuple[str, str]]:
        return self.writer.catch_up(
            job, done, physical, since, options, sink, self._process, noter(job, self.state), final
        )


def reindex(settings: BatchSettings, options: ReindexOptions, **kwargs: Any) -> ReindexResult:
    """Run one reindex job to the end (see ``Reindexer``)."""
    return Reindexer(settings, **kwargs).run(options)


def run_job(
    job_id: str,
    team_id: str,
    settings_overrides: dict[str, Any] | None = None,
    driver_nice: int = 0,
) -> dict:
    """Entry point of a job the admin API submitted (a Ray task, or the CLI's ``--job-id``):
    settings from the environment of the process, plus ``settings_overrides``."""
    settings = BatchSettings(**(settings_overrides or {}))
    options = ReindexOptions.from_settings(
        team_id, settings.reindex, job_id=job_id, driver_nice=driver_nice
    )
    result = reindex(settings, options)
    return result.job.public()
