"""What an ingestion or a deletion did, per document (the ingest API's and the bus
consumer's answers are made from it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from batch_ingest.source_store import Key

DocStatus = Literal["indexed", "unchanged", "failed", "deleted"]


@dataclass
class DocResult:
    doc_id: str
    team_id: str
    status: DocStatus
    chunks: int = 0
    removed_chunks: int = 0
    # Chunks embedded this time; the others kept the vectors stored for the same text.
    embedded_chunks: int = 0
    graph: bool = False
    error: str | None = None
    doc_type: str = ""
    # Chunks written by this call (searchable now), whatever the status says after it.
    written: bool = False
    # Failed for a passing cause (a backend unavailable, the registry): a retry applies it.
    retryable: bool = False


@dataclass
class IngestReport:
    results: list[DocResult] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    took_ms: float = 0.0

    @property
    def failed(self) -> list[DocResult]:
        return [r for r in self.results if r.status == "failed"]


def unrecorded(report: IngestReport, keys: set[Key], exc: Exception) -> None:
    """Fail the results of ``keys``: written (or deleted) but not recorded in the source
    registry, so a reindex would not know them (or bring them back) and the revision guard
    would not hold. A retry (a bus redelivery, the client again) finds the chunks in place
    and records them."""
    for r in report.results:
        if (r.team_id, r.doc_type, r.doc_id) in keys and r.status != "failed":
            r.status, r.retryable = "failed", True
            r.error = (
                f"not recorded in the source registry ({type(exc).__name__}: {exc}); "
                "retry to record it (its chunks are written)"
            )
