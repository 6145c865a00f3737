"""The callable class of the Ray Data actor pool. It lowers its process's CPU priority before
it imports anything heavy (the package's ``__init__`` imports nothing either), so that the
actor's imports and model load do not take the cores from searches either."""

from __future__ import annotations

import logging
from typing import Any

from deployments.priority import is_idle_policy, lower_priority

logger = logging.getLogger("batch_ingest.reindex")


class PoolWorker:
    """The callable class of the Ray Data actor pool: a process of its own, run at a lower
    CPU priority (``reindex.nice``, and ``SCHED_IDLE`` with ``reindex.idle_priority``) so the
    cores it shares with the Serve replicas go to searches first and to the reindex whenever
    they are idle; the work is ``ReindexWorker``'s."""

    def __init__(self, spec: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        reached = lower_priority(int(spec.get("nice", 0)), bool(spec.get("idle_priority")))
        logger.info("reindex worker: nice %d, idle policy %s", reached, is_idle_policy())
        from batch_ingest.reindex.worker import ReindexWorker

        self.worker = ReindexWorker(spec, *args, **kwargs)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        return self.worker(batch)
