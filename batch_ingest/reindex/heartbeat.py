"""The heartbeat of a running reindex job: a thread of its own writes the row's
``heartbeat_at`` every few seconds, whatever the job is doing (loading the model, waiting
for CPUs, a long batch), so readers can tell a slow job from a dead one
(``batch_ingest.reindex.liveness``)."""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from types import TracebackType

from batch_ingest.reindex.state import ReindexJob, ReindexState

logger = logging.getLogger("batch_ingest.reindex")


class Heartbeat:
    """``with Heartbeat(state, job, every_s):`` beats for ``job`` until the block ends.

    Each beat is a compare-and-set on the value the last one wrote (``ReindexState.beat``):
    if another driver took the job over (it was stalled and resumed elsewhere), this one
    stops beating and logs it rather than keep the job looking owned. A failed write (the
    database briefly away) is logged and tried again at the next beat.
    """

    def __init__(self, state: ReindexState, job: ReindexJob, every_s: float) -> None:
        self.state, self.job, self.every_s = state, job, every_s
        self.last: datetime | None = job.heartbeat_at
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"reindex-heartbeat-{job.job_id[:8]}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=max(self.every_s, 5.0))

    def beat(self) -> None:
        if self.lost:
            return
        try:
            written = self.state.beat(self.job.job_id, self.last)
        except Exception as exc:  # noqa: BLE001 (a missed beat must not stop the job)
            logger.warning("reindex job %s: heartbeat not written: %s", self.job.job_id, exc)
            return
        if written is None:
            self.lost = True
            logger.error(
                "reindex job %s: another driver took it over (its heartbeat changed); "
                "this one stops beating",
                self.job.job_id,
            )
            return
        self.last = self.job.heartbeat_at = written

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.beat()
