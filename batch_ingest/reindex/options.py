"""One reindex run: its options (defaults from ``ReindexSettings``), its result and the error
a job that cannot start or fails its verification raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from batch_ingest.reindex.state import ReindexJob
from batch_ingest.settings import ReindexSettings
from deployments.errors import GatewayError


class ReindexError(GatewayError):
    """The job cannot start, or its verification failed (the alias was not switched)."""

    code = "reindex_failed"


class VerificationFailed(ReindexError):
    """The target's rows do not match what the job wrote: ``--resume`` would skip the
    recorded documents and fail the same way, so the target is dropped."""


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
    # Custom Ray resources per actor (``ReindexSettings.actor_resources``).
    actor_resources: dict[str, float] = field(default_factory=dict)
    engine: Literal["ray", "local"] = "ray"
    keep_previous: bool = _DEFAULTS.keep_previous
    # Continue this (queued) job, e.g. one the admin API created.
    job_id: str | None = None
    log_every_s: float = 5.0
    # Catch-up looks this much further back than the job's own clock says (the registry rows
    # are stamped by the writers' clocks).
    clock_skew_s: float = 5.0
    # The last catch-up and the switch wait at most this long for the team's writes in flight
    # to finish (batch_ingest.write_barrier); the job fails (resumable) if they do not.
    switch_wait_s: float = 60.0
    # After announcing the new version the job gives the replicas up to this long (1 s per
    # 500 rows) to load it into memory before the switch.
    stage_max_s: float = 30.0
    # How long the Ray job waits for the CPUs (or custom resources) of its actor pool before
    # it fails, naming what is missing (its note says so meanwhile).
    resource_wait_s: float = _DEFAULTS.resource_wait_s
    # Build a team that has no documents and no collection (else refused as unknown: a typo).
    allow_empty: bool = False
    # The job's heartbeat period, and how old a heartbeat makes an active job dead
    # (``ReindexSettings.heartbeat_s`` / ``stale_after_s``).
    heartbeat_s: float = _DEFAULTS.heartbeat_s
    stale_after_s: float = _DEFAULTS.stale_after_s
    # Raise the driver's nice value by this before it starts an actor pool (the admin API's
    # Ray task, a process of its own: reindex.nice); 0 leaves it. A job that only copies
    # vectors keeps its priority.
    driver_nice: int = 0

    @classmethod
    def from_settings(cls, team_id: str, cfg: ReindexSettings, **given: Any) -> ReindexOptions:
        """Options for ``team_id`` with the pool and version options of ``cfg``; ``given``
        (``None`` values ignored) overrides any of them."""
        base = {
            "batch_size": cfg.batch_size,
            "actors": cfg.actors,
            "num_cpus_per_actor": cfg.num_cpus_per_actor,
            "actor_resources": dict(cfg.actor_resources),
            "keep_previous": cfg.keep_previous,
            "resource_wait_s": cfg.resource_wait_s,
            "heartbeat_s": cfg.heartbeat_s,
            "stale_after_s": cfg.stale_after_s,
        }
        return cls(team_id=team_id, **{**base, **{k: v for k, v in given.items() if v is not None}})


@dataclass
class ReindexResult:
    job: ReindexJob
    dropped_versions: list[int] = field(default_factory=list)
    took_s: float = 0.0
