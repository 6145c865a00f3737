"""``TargetWriter``: writes a team's documents into the version a reindex builds — the bulk
pass (Ray Data or in-process), the catch-ups from the source registry, and the documents a
model change leaves to embed after the switch."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from batch_ingest.documents import make_chunk_id
from batch_ingest.reindex.engines import BatchSink, run_local, run_ray
from batch_ingest.reindex.options import ReindexOptions
from batch_ingest.reindex.state import ReindexJob, ReindexState
from batch_ingest.reindex.worker import ReindexWorker
from batch_ingest.source_store import SourceStore
from deployments.vector_store.versions import CollectionVersions

logger = logging.getLogger("batch_ingest.reindex")

Process = Callable[..., None]
Note = Callable[[str | None], None]


class TargetWriter:
    """Writes documents into one target version.

    Args:
        spec: ``worker_spec(settings)`` (what a Ray Data actor builds its worker from).
        versions, sources, state: the job's collections, source registry and job records.
        worker_factory: ``(physical, check_existing) -> ReindexWorker`` of the in-process
            worker.
    """

    def __init__(
        self,
        spec: dict,
        versions: CollectionVersions,
        sources: SourceStore,
        state: ReindexState,
        worker_factory: Callable[[str, bool], ReindexWorker],
    ) -> None:
        self.spec = spec
        self.versions = versions
        self.sources = sources
        self.state = state
        self.worker_factory = worker_factory
        # The in-process worker (its model loads on first need), kept per target.
        self._local: ReindexWorker | None = None
        # The version being replaced, whose vectors are copied (set per run).
        self.source: str | None = None

    def source_of(self, job: ReindexJob) -> str | None:
        """The physical version the job replaces, if there is one."""
        version = job.source_version
        if version is None or version == job.target_version:
            return None
        return self.versions.name(job.team_id, version)

    def copies_only(self, tag: str) -> bool:
        """Whether the version being replaced holds rows, all embedded with ``tag``."""
        if self.source is None:
            return False
        from deployments.vector_store.filter import milvus_literal

        return bool(self.versions.count(self.source)) and not self.versions.count(
            self.source, f"embed_model != {milvus_literal(tag)}"
        )

    def worker(self, physical: str, check_existing: bool) -> ReindexWorker:
        """The in-process worker for ``physical``."""
        worker = self._local
        if worker is None or worker.physical != physical:
            worker = self._local = self.worker_factory(physical, check_existing)
        worker.check_existing = check_existing
        worker.source = self.source
        return worker

    def process(
        self,
        documents: list[str],
        physical: str,
        check_existing: bool,
        options: ReindexOptions,
        sink: BatchSink,
        on_note: Note | None = None,
    ) -> None:
        """Write ``documents`` (JSON) into ``physical`` with the options' engine."""
        if not documents:
            return
        if options.engine == "ray":
            args = (physical, check_existing, self.source)
            run_ray(self.spec, args, documents, options, sink, on_note)
            return
        run_local(self.worker(physical, check_existing), documents, options.batch_size, sink)

    def catch_up(
        self,
        job: ReindexJob,
        done: dict[tuple[str, str], int],
        physical: str,
        since: datetime | None,
        options: ReindexOptions,
        sink: BatchSink,
        process: Process,
        on_note: Note | None = None,
        final: bool = False,
    ) -> list[tuple[str, str]]:
        """Apply the documents written or deleted since ``since`` to the target (through
        ``process``). ``final`` (the writes are paused): in-process, without loading the
        model; returns the keys of documents that need it (taken out of the target
        meanwhile)."""
        if since is None:
            return []
        rows = self.sources.changed_since(
            job.team_id, since - timedelta(seconds=options.clock_skew_s)
        )
        live = [r.document for r in rows if not r.deleted and r.document is not None]
        gone = [
            (r.doc_type, r.doc_id) for r in rows if r.deleted and (r.doc_type, r.doc_id) in done
        ]
        if gone:
            ids = [make_chunk_id(job.team_id, k[0], k[1], i) for k in gone for i in range(done[k])]
            self.versions.delete(physical, ids)
            self.state.unmark(job.job_id, gone)
            for key in gone:
                done.pop(key)
        deferred: list[tuple[str, str]] = []
        if live:
            job.total_docs = job.total_docs + sum(
                1 for d in live if (d.doc_type, d.doc_id) not in done
            )
            texts = [d.model_dump_json() for d in live]
            if final:
                worker = self.worker(physical, False)
                for start in range(0, len(texts), options.batch_size):
                    part = texts[start : start + options.batch_size]
                    sink(worker.process(part, allow_embed=False))
                    deferred += worker.deferred
            else:
                # Every changed document is written again (its metadata may have changed);
                # its vectors are reused where its text is stored already.
                process(texts, physical, False, options, sink, on_note)
        if rows:
            logger.info(
                "reindex %s: caught up on %d changed and %d deleted documents%s",
                job.team_id,
                len(live),
                len(gone),
                " (writes paused)" if final else "",
            )
        return deferred

    def write_current(
        self,
        team_id: str,
        keys: list[tuple[str, str]],
        worker: ReindexWorker,
        sink: BatchSink,
    ) -> None:
        """Write the registry's current state of ``keys`` (deleted ones skipped) with
        ``worker`` (the caller holds the team's writes paused)."""
        rows = [self.sources.get((team_id, *key)) for key in keys]
        live = [r.document for r in rows if r and not r.deleted and r.document is not None]
        if live:
            sink(worker.process([d.model_dump_json() for d in live]))
