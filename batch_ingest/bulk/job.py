"""The bulk import's driver: the validated documents go through ``BulkWorker``s on a Ray Data
actor pool (the reindex's engine, batch_ingest/reindex/engines.py) or, with ``engine="local"``,
one in this process; results stream back per batch into the tally and the progress bar. The
documents that failed are tried once more in a second pass; what still fails is reported."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tqdm import tqdm

from batch_ingest.bulk.sources import Row
from batch_ingest.bulk.worker import BulkPoolWorker, BulkWorker, worker_spec
from batch_ingest.reindex.engines import run_local, run_ray
from batch_ingest.reindex.options import ReindexOptions
from batch_ingest.settings import BatchSettings

logger = logging.getLogger("batch_ingest.bulk")


@dataclass
class BulkOptions:
    """One run. ``None`` pool options take ``reindex.*`` (``REINDEX__BATCH_SIZE`` ...)."""

    team_id: str
    engine: Literal["ray", "local"] = "ray"
    batch_size: int | None = None
    actors: int | None = None
    num_cpus_per_actor: float | None = None
    # Passes over a failed document: the first and one retry.
    passes: int = 2
    progress: bool = True


@dataclass
class Failure:
    where: str
    doc_type: str
    doc_id: str
    error: str


@dataclass
class BulkResult:
    documents: int = 0
    indexed: int = 0
    unchanged: int = 0
    chunks: int = 0
    # Documents of the second pass (they failed in the first).
    retried: int = 0
    failed: list[Failure] = field(default_factory=list)
    took_s: float = 0.0

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / max(self.took_s, 1e-9)

    def counts(self) -> str:
        """``documents=12 indexed=10 unchanged=2 failed=0 retried=1 chunks=40``."""
        return (
            f"documents={self.documents} indexed={self.indexed} unchanged={self.unchanged} "
            f"failed={len(self.failed)} retried={self.retried} chunks={self.chunks}"
        )


class BulkJob:
    """Imports validated rows of ``options.team_id`` with ``settings``' pipeline.

    Args:
        settings: the pipeline's (Milvus, Neo4j, the registry, the model) and the pool's
            defaults (``reindex.*``).
        worker_factory: the in-process worker of ``engine="local"`` (tests inject one over
            a fake pipeline); default a ``BulkWorker`` of ``settings``.
    """

    def __init__(
        self,
        settings: BatchSettings,
        options: BulkOptions,
        *,
        worker_factory: Callable[[], BulkWorker] | None = None,
    ) -> None:
        self.settings = settings
        self.options = options
        self.spec = worker_spec(settings)
        self.pool = ReindexOptions.from_settings(
            options.team_id,
            settings.reindex,
            batch_size=options.batch_size,
            actors=options.actors,
            num_cpus_per_actor=options.num_cpus_per_actor,
        )
        self._worker_factory = worker_factory or (lambda: BulkWorker(self.spec, options.team_id))
        self._local: BulkWorker | None = None
        self.result = BulkResult()

    def run(self, rows: list[Row]) -> BulkResult:
        """Every row written (or reported failed), each at most ``options.passes`` times.

        Raises:
            ValueError: a row of another team (``read_documents`` refuses them already).
            Exception: what the engine raised (Ray gone, the pool never placed): the counts
                so far stay in ``self.result``.
        """
        for row in rows:
            if row.doc.team_id != self.options.team_id:
                raise ValueError(f"{row.where}: not a document of team {self.options.team_id!r}")
        result = self.result = BulkResult(documents=len(rows))
        started = time.perf_counter()
        todo = list(rows)
        bar = tqdm(total=len(rows), unit="doc", disable=not self.options.progress, mininterval=1.0)
        try:
            for attempt in range(1, max(1, self.options.passes) + 1):
                failed = self._pass(todo, bar, started)
                if not failed:
                    break
                if attempt == max(1, self.options.passes):
                    result.failed = failed
                    break
                logger.warning("%d documents failed; trying them once more", len(failed))
                by_key = {(r.doc.doc_type, r.doc.doc_id): r for r in todo}
                todo = [by_key[(f.doc_type, f.doc_id)] for f in failed]
                result.retried += len(todo)
        finally:
            bar.close()
            result.took_s = time.perf_counter() - started
            if self._local is not None:
                self._local.close()
                self._local = None
        return result

    def _pass(self, rows: list[Row], bar: Any, started: float) -> list[Failure]:
        """One pass over ``rows``; the failures, in input order."""
        if not rows:
            return []
        where = {(r.doc.doc_type, r.doc.doc_id): r.where for r in rows}
        failed: dict[tuple[str, str], Failure] = {}
        answered: set[tuple[str, str]] = set()
        result = self.result

        def sink(batch: list[dict[str, Any]]) -> None:
            done = 0
            for r in batch:
                key = (str(r["doc_type"]), str(r["doc_id"]))
                answered.add(key)
                if r["status"] == "indexed":
                    result.indexed += 1
                elif r["status"] == "unchanged":
                    result.unchanged += 1
                else:
                    error = str(r.get("error") or r["status"])
                    failed[key] = Failure(where.get(key, "?"), *key, error)
                    continue
                result.chunks += int(r["chunks"])
                done += 1
            bar.update(done)
            took = time.perf_counter() - started
            bar.set_postfix(chunks=result.chunks, chunks_s=f"{result.chunks / max(took, 1e-9):.1f}")

        documents = [r.doc.model_dump_json() for r in rows]
        if self.options.engine == "local":
            if self._local is None:
                self._local = self._worker_factory()
            run_local(self._local, documents, self.pool.batch_size, sink)
        else:
            run_ray(
                self.spec,
                (self.options.team_id,),
                documents,
                self.pool,
                sink,
                worker=BulkPoolWorker,
            )
        for key in where.keys() - answered:
            failed[key] = Failure(where[key], *key, "no result came back for it")
        return [failed[k] for k in where if k in failed]
