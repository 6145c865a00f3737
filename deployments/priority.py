"""CPU priority of the processes that do bulk work beside the searches: a reindex's and a bulk
import's workers and driver (batch_ingest/reindex/, batch_ingest/bulk/) and the Embedder replica
on a CPU (deployments/models/embedder.py, ``embedder.nice``). They share the cores with the Serve
replicas that answer searches, and a search must never wait for a bulk job. Only ``os`` is
imported here: a worker calls it before it imports anything heavy."""

from __future__ import annotations

import os


def _threads() -> list[int]:
    """This process's thread ids (Linux keeps a nice value and a policy per thread)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def lower_priority(nice: int, idle: bool = False) -> int:
    """Raise this process's nice value by ``nice`` and, with ``idle``, put it under Linux's
    ``SCHED_IDLE`` policy (a core goes to it only when no other process wants one): every
    thread it has, and so every thread it starts. Returns the nice value reached. Either step
    is skipped where the system does not offer it; neither can be undone by this process."""
    policy = getattr(os, "SCHED_IDLE", None) if idle else None
    for tid in _threads():
        try:
            if nice > 0:
                now = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
            if policy is not None:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError:  # a thread that ended meanwhile, or a policy refused
            continue
    return os.getpriority(os.PRIO_PROCESS, 0)


def is_idle_policy() -> bool:
    """Whether this thread runs under ``SCHED_IDLE``."""
    policy = getattr(os, "SCHED_IDLE", None)
    return policy is not None and os.sched_getscheduler(0) == policy
