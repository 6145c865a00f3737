"""The outcome of applying events: per-event results and the HTTP response model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)

from batch_ingest.events.envelope import InvalidEvent, MappedEvent

EventStatus = Literal["indexed", "unchanged", "skipped_stale", "deleted", "failed", "invalid"]


class EventResult(BaseModel):
    """The outcome of one event (``POST /ingest/events`` and the consumer)."""

    event_id: str
    type: str = ""
    team_id: str = ""
    doc_type: str = ""
    doc_id: str = ""
    revision: int | None = None
    status: EventStatus
    chunks: int = 0
    removed_chunks: int = 0
    graph: bool = False
    # The document's new chunks were written (also on a ``failed`` whose graph write failed).
    searchable: bool = False
    error: str | None = None
    # A ``failed`` event whose cause passes (a backend down, a document busy, the registry
    # unwritten): the bus retries it with back-off until it applies, a client may resend it.
    retryable: bool = False
    fields: list[dict[str, Any]] | None = None
    # The event's own meta.trace_id ("" when it has none); the response's trace_id is the
    # HTTP request's.
    trace_id: str = ""


class IngestEventsResponse(BaseModel):
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    counts: dict[str, int]
    events: list[EventResult]
    took_ms: float
    trace_id: str


def result_of(ev: MappedEvent, status: EventStatus, **kw: Any) -> EventResult:
    return EventResult(
        event_id=ev.event_id,
        type=ev.envelope.type,
        team_id=ev.key[0],
        doc_type=ev.key[1],
        doc_id=ev.key[2],
        revision=ev.revision,
        status=status,
        trace_id=ev.trace_id,
        **kw,
    )


def invalid_result(ev: InvalidEvent) -> EventResult:
    return EventResult(
        event_id=ev.event_id,
        type=ev.type,
        status="invalid",
        error=ev.message,
        fields=ev.fields,
        trace_id=ev.trace_id,
    )


def count_statuses(results: list[EventResult]) -> dict[str, int]:
    statuses = ("indexed", "unchanged", "skipped_stale", "deleted", "failed", "invalid")
    return {s: sum(r.status == s for r in results) for s in statuses}
