"""The bulk import's worker: the gateway's ingestion pipeline in one process (a Ray Data
actor, or the driver with ``--local``), each call writing a batch of documents through it.

Only the standard library and ``deployments.priority`` are imported at the top: a Ray actor
unpickling ``BulkPoolWorker`` lowers its CPU priority before the pipeline's imports and model
load, as the reindex's actors do (batch_ingest/reindex/pool.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from deployments.priority import is_idle_policy, lower_priority

if TYPE_CHECKING:
    from batch_ingest.ingest_report import DocResult, IngestReport
    from batch_ingest.pipeline import IngestPipeline
    from batch_ingest.settings import BatchSettings

logger = logging.getLogger("batch_ingest.bulk")

# The result columns of a batch, one value per document of it.
RESULT_COLUMNS = ("doc_type", "doc_id", "status", "chunks", "error")
# The settings sections a worker builds its pipeline from.
SECTIONS = {"environment", "embedder", "embedder_next", "milvus", "neo4j", "state", "chunking"}


def worker_spec(settings: BatchSettings) -> dict[str, Any]:
    """What a worker needs, as plain data: the pipeline's settings sections (the driver's,
    wherever the actor runs) and the pool's threads and priority (``reindex.*``)."""
    return {
        "settings": settings.model_dump(mode="json", include=SECTIONS),
        # 0: the cores of the node the worker runs on (resolved there).
        "torch_threads": settings.reindex.torch_threads,
        "nice": settings.reindex.nice,
        "idle_priority": settings.reindex.idle_priority,
    }


def build_worker_pipeline(spec: dict[str, Any]) -> IngestPipeline:
    """``batch_ingest.consumer.build_pipeline`` of ``spec``'s settings, the model running
    ``torch_threads`` intra-op threads (0: this node's cores), like a reindex worker's."""
    from batch_ingest.consumer import build_pipeline
    from batch_ingest.settings import BatchSettings
    from deployments.config import node_threads

    settings = BatchSettings.model_validate(spec["settings"])
    threads = {"torch_threads": node_threads(int(spec.get("torch_threads", 0)))}
    update: dict[str, Any] = {"embedder": settings.embedder.model_copy(update=threads)}
    if settings.embedder_next is not None:
        update["embedder_next"] = settings.embedder_next.model_copy(update=threads)
    return build_pipeline(settings.model_copy(update=update), usage_source="bulk")


class BulkWorker:
    """Writes batches of one team's documents through ``pipeline`` on an event loop of its
    own (kept for its life: the graph driver's connections belong to it).

    Args:
        spec: ``worker_spec(settings)``; unused when ``pipeline`` is given.
        team_id: the job's team; a document of another never reaches the pipeline.
        pipeline: injected by tests; built from ``spec`` when ``None``.
    """

    def __init__(
        self, spec: dict[str, Any], team_id: str, *, pipeline: IngestPipeline | None = None
    ) -> None:
        self.team_id = team_id
        self.loop = asyncio.new_event_loop()
        self.pipeline = pipeline if pipeline is not None else build_worker_pipeline(spec)

    def process(self, documents: list[str]) -> list[dict[str, Any]]:
        """Per document (JSON of a ``SourceDocument``), in input order: ``{doc_type, doc_id,
        status, chunks, error}``; ``status`` is ``indexed``, ``unchanged`` or ``failed``
        (``error`` says why; ``""`` otherwise). Never raises for a document's sake: a batch
        the pipeline refuses whole (a backend down) is ``failed`` document by document."""
        from batch_ingest.documents import SourceDocument

        docs = [SourceDocument.model_validate_json(d) for d in documents]
        mine = [d for d in docs if d.team_id == self.team_id]
        results: dict[tuple[str, str], dict[str, Any]] = {}
        for doc in docs:
            if doc.team_id != self.team_id:  # the driver refused it already: never written
                results[(doc.doc_type, doc.doc_id)] = _row(
                    doc.doc_type, doc.doc_id, "failed", error=f"not team {self.team_id!r}"
                )
        try:
            report = self.loop.run_until_complete(self.pipeline.ingest(mine)) if mine else None
        except Exception as exc:  # noqa: BLE001 (every document failed; the driver retries)
            logger.warning("bulk batch of %d documents failed: %s", len(mine), exc)
            error = f"{type(exc).__name__}: {exc}"
            for doc in mine:
                results[(doc.doc_type, doc.doc_id)] = _row(
                    doc.doc_type, doc.doc_id, "failed", error=error
                )
        else:
            for result in report.results if report is not None else ():
                results[(result.doc_type, result.doc_id)] = self._outcome(result, report)
        return [
            results.get((d.doc_type, d.doc_id))
            or _row(d.doc_type, d.doc_id, "failed", error="no result from the pipeline")
            for d in docs
        ]

    def _outcome(self, result: DocResult, report: IngestReport | None) -> dict[str, Any]:
        """A document's row; one the graph missed is ``failed`` (its retry, ``unchanged``,
        merges it again)."""
        status, error = result.status, result.error or ""
        if status != "failed" and self.pipeline.graph is not None and not result.graph:
            degraded = "; ".join(report.degraded) if report is not None else ""
            status, error = "failed", degraded or "graph not updated"
        return _row(result.doc_type, result.doc_id, status, result.chunks, error)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        rows = self.process([str(d) for d in batch["document"]])
        return {key: [r[key] for r in rows] for key in RESULT_COLUMNS}

    def close(self) -> None:
        """Close the graph's driver and the loop (the in-process worker, at the end)."""
        graph = self.pipeline.graph
        close = getattr(graph, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(close())
        self.loop.close()


class BulkPoolWorker:
    """The callable class of the Ray Data actor pool: lowers the actor's CPU priority
    (``reindex.nice``, ``reindex.idle_priority``) before it builds a ``BulkWorker``, so the
    cores it shares with the Serve replicas go to searches first."""

    def __init__(self, spec: dict[str, Any], team_id: str) -> None:
        reached = lower_priority(int(spec.get("nice", 0)), bool(spec.get("idle_priority")))
        logger.info("bulk worker: nice %d, idle policy %s", reached, is_idle_policy())
        self.worker = BulkWorker(spec, team_id)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        return self.worker(batch)


def _row(doc_type: str, doc_id: str, status: str, chunks: int = 0, error: str = "") -> dict:
    return {
        "doc_type": doc_type,
        "doc_id": doc_id,
        "status": status,
        "chunks": chunks,
        "error": error,
    }
