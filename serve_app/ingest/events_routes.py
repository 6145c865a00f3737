"""POST /ingest/events: a batch of bus-event envelopes (batch_ingest/events/)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from batch_ingest.events import IngestEventsResponse, InvalidEvent, parse_event
from batch_ingest.events.envelope import envelope_schema
from serve_app.http.deps import Caller
from serve_app.ingest.routes import Ingest

router = APIRouter(tags=["ingest"])


class IngestEventsRequest(BaseModel):
    """Envelopes ``{event_id, ts, domain, type, version, actor, payload, meta}``."""

    model_config = ConfigDict(extra="forbid")

    # Validated one by one (parse_event), so that ``partial`` can keep the valid ones; the
    # schema is the envelope's. maxItems: ingest.max_documents (serve_app/openapi.py).
    events: list[dict[str, Any]] = Field(
        min_length=1, json_schema_extra={"items": envelope_schema()}
    )
    # false: any invalid envelope makes the whole request a 422 (nothing applied);
    # true: invalid envelopes come back with status "invalid" and the others are applied.
    partial: bool = False


@router.post("/ingest/events", response_model=IngestEventsResponse)
async def ingest_events(
    body: IngestEventsRequest, caller: Caller, ingest: Ingest
) -> IngestEventsResponse:
    """Apply upsert/delete events idempotently: per document, only an event newer than the
    stored revision changes anything. Per-event status: indexed, unchanged, skipped_stale,
    deleted, failed, invalid."""
    parsed = [parse_event(raw) for raw in body.events]
    if not body.partial:
        errors = [
            {
                "loc": ("body", "events", i, *f["field"].split(".")),
                "msg": f["problem"],
                "type": "value_error",
            }
            for i, ev in enumerate(parsed)
            if isinstance(ev, InvalidEvent)
            for f in ev.fields
        ]
        if errors:
            raise RequestValidationError(errors)
    return await ingest.ingest_events(parsed, caller)
