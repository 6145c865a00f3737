"""The end of a reindex job whose target is live: the job's record of what is live, the
team's other versions dropped (``--keep-previous`` keeps the one it replaced), and its
success saved. The last catch-up deleted and added documents after the switch, so the counts
are taken again here rather than kept from the verification."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from batch_ingest.generations import IndexGenerations
from batch_ingest.reindex.options import ReindexOptions, ReindexResult
from batch_ingest.reindex.state import JobStatus, ReindexJob, ReindexState
from batch_ingest.source_store import SourceStore
from deployments.vector_store.versions import CollectionVersions

logger = logging.getLogger("batch_ingest.reindex")


class JobFinish:
    """Finishes a job after its switch (or a resumed one that had switched already).

    Args:
        versions, sources, state: the job's collections, source registry and job records.
        generations: raised once more (the catch-up after the switch changed the team).
    """

    def __init__(
        self,
        versions: CollectionVersions,
        sources: SourceStore,
        state: ReindexState,
        generations: IndexGenerations,
    ) -> None:
        self.versions = versions
        self.sources = sources
        self.state = state
        self.generations = generations

    def run(self, job: ReindexJob, options: ReindexOptions, started: float) -> ReindexResult:
        """Record ``job`` as succeeded (``started``: its ``perf_counter`` start)."""
        team = job.team_id
        # The record says what is live once the last catch-up is done (it deleted and added).
        if job.target_version is not None:
            physical = self.versions.name(team, job.target_version)
            self.versions.flush(physical)
            job.rows_in_target = self.versions.count(physical)
        job.total_docs = self.sources.count(team)
        job.done_docs = len(self.state.done(job.job_id))
        self.generations.bump([team])  # the catch-up after the switch changed it again
        dropped = []
        for version in self.versions.existing(team):
            if version == job.target_version:
                continue
            if options.keep_previous and version == job.source_version:
                continue
            if self.versions.drop(team, version):
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
