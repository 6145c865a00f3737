"""Prometheus metrics through Ray Serve (``ray.serve.metrics``), and those of the model
replicas.

A metric here is created on its first use inside a Serve replica, so it carries that
replica's ``deployment``, ``replica`` and ``application`` tags, and Ray's metrics agent on the
node exports it (with a ``ray_`` prefix) on the node's metrics export port. Anywhere else
(unit tests without Ray, the CLIs, the bus consumer, Ray Data workers) recording is a no-op
that costs a dictionary lookup: no Ray import, no metric object. Recording never raises.

docs/operations.md, "Metrics", lists every metric; deploy/grafana/rag-gateway.json shows them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

_CREATE = threading.Lock()
# METRICS__ENABLED=false turns every metric of the gateway off in the processes that inherit
# it (a benchmark measures the cost of the metrics that way; Ray's own metrics stay).
ENABLED = os.environ.get("METRICS__ENABLED", "true").strip().lower() not in ("0", "false", "no")

# Bucket bounds shared by the latency-like histograms (seconds).
SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
# Batch sizes (texts or requests per batch).
BATCH_SIZES: list[float] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def in_serve_replica() -> bool:
    """This process is a Ray Serve replica (its replica context is set). Checked without
    importing Ray: a process that never imported ``ray.serve`` is no replica."""
    context = sys.modules.get("ray.serve.context")
    if context is None or not ENABLED:
        return False
    try:
        return context._get_internal_replica_context() is not None
    except Exception:  # a Ray without this internal: record nothing rather than fail
        return False


class _Metric:
    """A ``ray.serve.metrics`` metric made on first use inside a replica (its Serve tags are
    fixed when it is made, so it cannot be made at import time)."""

    def __init__(self, name: str, description: str, tag_keys: tuple[str, ...] = ()) -> None:
        self.name = name
        self.description = description
        self.tag_keys = tag_keys
        self._metric: Any = None
        self._failed = False

    @property
    def live(self) -> bool:
        """Recording reaches Ray (callers skip work that only feeds the metric otherwise)."""
        return self._metric is not None or (not self._failed and in_serve_replica())

    def _make(self) -> Any:
        raise NotImplementedError

    def _get(self) -> Any:
        if self._metric is not None:
            return self._metric
        if self._failed or not in_serve_replica():
            return None
        with _CREATE:
            if self._metric is None and not self._failed:
                try:
                    self._metric = self._make()
                except Exception:
                    self._failed = True
                    logger.warning("metric %s could not be created", self.name, exc_info=True)
        return self._metric

    def _tags(self, tags: dict[str, Any]) -> dict[str, str] | None:
        return {k: str(v) for k, v in tags.items()} if self.tag_keys else None


class Counter(_Metric):
    def _make(self) -> Any:
        from ray.serve import metrics

        tag_keys: Any = self.tag_keys or None  # its stubs say tuple[str], meaning any length
        return metrics.Counter(self.name, self.description, tag_keys=tag_keys)

    def inc(self, value: float = 1.0, **tags: Any) -> None:
        """Add ``value`` (a value ≤ 0 adds nothing); ``tags`` name every tag key."""
        if value <= 0:
            return
        metric = self._get()
        if metric is None:
            return
        try:
            metric.inc(value, tags=self._tags(tags))
        except Exception:
            logger.debug("metric %s not recorded", self.name, exc_info=True)


class Histogram(_Metric):
    def __init__(
        self,
        name: str,
        description: str,
        boundaries: Sequence[float],
        tag_keys: tuple[str, ...] = (),
    ) -> None:
        super().__init__(name, description, tag_keys)
        self.boundaries = list(boundaries)

    def _make(self) -> Any:
        from ray.serve import metrics

        tag_keys: Any = self.tag_keys or None
        return metrics.Histogram(
            self.name, self.description, boundaries=self.boundaries, tag_keys=tag_keys
        )

    def observe(self, value: float, **tags: Any) -> None:
        metric = self._get()
        if metric is None:
            return
        try:
            metric.observe(float(value), tags=self._tags(tags))
        except Exception:
            logger.debug("metric %s not recorded", self.name, exc_info=True)


# --- the model replicas (deployments/models/embedder.py, deployments/models/reranker.py) ------

EMBEDDER_BATCH_SIZE = Histogram(
    "rag_gateway_embedder_batch_size",
    "Texts per model batch of the Embedder deployment, by kind (query, passage)",
    BATCH_SIZES,
    ("kind",),
)
EMBEDDER_QUEUE_WAIT = Histogram(
    "rag_gateway_embedder_queue_wait_seconds",
    "Time a request's texts waited in the Embedder's @serve.batch queue before their model "
    "batch started, by kind (query, passage)",
    SECONDS,
    ("kind",),
)
RERANKER_BATCH_SIZE = Histogram(
    "rag_gateway_reranker_batch_size",
    "Rerank requests (query + candidate passages) per @serve.batch batch of the Reranker",
    BATCH_SIZES,
)

# --- ingestion (batch_ingest/pipeline.py): the per-team metering ---------------------------

EMBEDDED_TOKENS = Counter(
    "rag_gateway_embedded_tokens",
    "Passage tokens embedded at ingestion, per team (the chunker's token count of the chunk "
    "texts sent to the embedder; unchanged documents are not re-embedded)",
    ("team_id",),
)
