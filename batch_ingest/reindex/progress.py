"""Progress of a reindex job: done/total documents, rate and ETA, logged and saved."""

from __future__ import annotations

import logging
import time

from batch_ingest.reindex.state import ReindexJob, ReindexState

logger = logging.getLogger("batch_ingest.reindex")


class Progress:
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
