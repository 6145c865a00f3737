"""The last step of a reindex job: the replicas told of the new version ahead of time, then
the last catch-up and the alias switch with the team's writes paused."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from batch_ingest.generations import IndexGenerations
from batch_ingest.reindex.engines import BatchSink
from batch_ingest.reindex.options import ReindexOptions
from batch_ingest.reindex.state import ReindexJob
from batch_ingest.reindex.writer import TargetWriter
from batch_ingest.write_barrier import WriteBarrier
from deployments.vector_store.versions import CollectionVersions

logger = logging.getLogger("batch_ingest.reindex")


class VersionSwitch:
    """Announces a job's target to the replicas, switches the team's alias to it, or
    withdraws the announcement when the job fails.

    Args:
        versions: the versioned collections (or a test double: ``announce``/``withdraw``
            are optional there).
        writer: the job's ``TargetWriter`` (documents to embed after the switch).
        barrier: pauses the team's writes; ``generations``: raised at the switch (answers
            cached for the old version are stale).
    """

    def __init__(
        self,
        versions: CollectionVersions,
        writer: TargetWriter,
        barrier: WriteBarrier,
        generations: IndexGenerations,
    ) -> None:
        self.versions = versions
        self.writer = writer
        self.barrier = barrier
        self.generations = generations

    def announce(self, job: ReindexJob) -> float:
        """Announce the target to the replicas' in-memory indexes; when (monotonic)."""
        announce = getattr(self.versions, "announce", None)
        if announce is not None and job.target_version is not None:
            announce(job.team_id, job.target_version)
        return time.monotonic()

    def withdraw(self, team: str) -> None:
        """Replicas stop holding a copy of a version that will not go live."""
        withdraw = getattr(self.versions, "withdraw", None)
        if withdraw is None:
            return
        try:
            withdraw(team)
        except Exception as exc:  # the job failed already; a stale announcement is harmless
            logger.warning("reindex %s: announcement not withdrawn: %s", team, exc)

    def run(
        self,
        job: ReindexJob,
        done: dict[tuple[str, str], int],
        physical: str,
        last_catch_up: Callable[[], list[tuple[str, str]]],
        options: ReindexOptions,
        sink: BatchSink,
    ) -> None:
        """The last catch-up and the alias switch, with the team's writes paused
        (``batch_ingest.write_barrier``): the writes in flight finish first, so every write
        acknowledged before is in the registry and reaches the new version before searches
        do; writes after it go through the alias into the new version. No write is applied
        twice and none is undone. A document whose new text needs the model (a model
        change) is taken out of the new version under the barrier and embedded after the
        switch (absent meanwhile, never stale)."""
        team = job.team_id
        with self.barrier.switching(team, options.switch_wait_s):
            paused = time.perf_counter()
            deferred = last_catch_up()
            job.expected_chunks = sum(done.values())
            if self.versions.current(team) != job.target_version:
                assert job.target_version is not None  # set by the job
                self.versions.switch(team, job.target_version)
            self.generations.bump([team])  # searches read the new version from here on
            held = time.perf_counter() - paused
        logger.info(
            "reindex %s: writes paused %.0f ms for the last catch-up and the switch%s",
            team,
            held * 1000,
            f" ({len(deferred)} documents to embed after it)" if deferred else "",
        )
        if deferred:
            # Outside the pause the model loads, then the documents' newest states are
            # written with the writes paused again (a newer write is never overwritten).
            worker = self.writer.worker(physical, False)
            worker.load_model()
            with self.barrier.switching(team, options.switch_wait_s):
                self.writer.write_current(team, deferred, worker, sink)
            job.expected_chunks = sum(done.values())
