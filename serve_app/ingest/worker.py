"""The background worker of ingestion jobs (``batch_ingest/jobs.py``) in a gateway replica.

Every Ingress replica runs one (from the app's lifespan): it claims the oldest runnable job,
keeps its lease alive while the pipeline indexes the documents, and records the result. A
backend that does not answer (Milvus, the embedder) puts the job back in the queue with a
growing delay instead of failing it; anything else fails it with the error. A replica that
dies leaves a lease that expires, and another replica takes the job over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from batch_ingest.documents import SourceDocument
from batch_ingest.jobs import IngestJob, IngestJobs
from deployments.errors import BackendUnavailable
from deployments.tracing import trace_context

logger = logging.getLogger(__name__)

Process = Callable[[IngestJob, list[SourceDocument]], Awaitable[dict[str, Any]]]


class JobWorker:
    """Claims and runs jobs one at a time.

    Args:
        jobs: the job table.
        process: indexes a job's documents and returns the result to store.
        poll_s: how often to look for work when nothing woke the worker.
        lease_s: a claim's lease, renewed every third of it while the job runs.
        max_attempts: runs of one job before it is failed for good.
    """

    def __init__(
        self,
        jobs: IngestJobs,
        process: Process,
        *,
        poll_s: float = 5.0,
        lease_s: float = 60.0,
        max_attempts: int = 20,
    ) -> None:
        self.jobs = jobs
        self.process = process
        self.poll_s = poll_s
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Look for work now (a job was just submitted)."""
        self._wake.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the worker loop for the duration of the context."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="ingest-jobs")
        try:
            yield
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                while await self.run_one():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:  # the state database is away: try again later
                logger.exception("ingest job worker")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
            self._wake.clear()

    async def run_one(self) -> bool:
        """Claim and run one job; False when there was none to claim."""
        claimed = await asyncio.to_thread(self.jobs.claim, self.owner, self.lease_s)
        if claimed is None:
            return False
        job, docs = claimed
        with trace_context(job.trace_id):
            logger.info(
                "ingest job %s: %d documents, %d characters (attempt %d)",
                job.job_id,
                job.documents,
                job.chars,
                job.attempts,
            )
            keepalive = asyncio.create_task(self._renew(job.job_id))
            try:
                result = await self.process(job, docs)
            except BackendUnavailable as exc:
                await self._retry_or_fail(job, str(exc.message))
            except asyncio.CancelledError:
                raise  # the replica stops; the lease expires and another replica resumes
            except Exception as exc:
                logger.exception("ingest job %s failed", job.job_id)
                await asyncio.to_thread(
                    self.jobs.fail, job.job_id, self.owner, f"{type(exc).__name__}: {exc}"
                )
            else:
                await asyncio.to_thread(self.jobs.finish, job.job_id, self.owner, result)
                logger.info("ingest job %s done", job.job_id)
            finally:
                keepalive.cancel()
        return True

    async def _retry_or_fail(self, job: IngestJob, error: str) -> None:
        if job.attempts >= self.max_attempts:
            message = f"gave up after {job.attempts} attempts: {error}"
            await asyncio.to_thread(self.jobs.fail, job.job_id, self.owner, message)
            return
        delay = min(5.0 * 2 ** (job.attempts - 1), 300.0)
        logger.warning("ingest job %s: %s; retrying in %.0f s", job.job_id, error, delay)
        await asyncio.to_thread(self.jobs.retry_later, job.job_id, self.owner, error, delay)

    async def _renew(self, job_id: str) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await asyncio.to_thread(self.jobs.renew, job_id, self.owner, self.lease_s)
            except Exception:
                logger.warning("ingest job %s: lease not renewed", job_id, exc_info=True)
