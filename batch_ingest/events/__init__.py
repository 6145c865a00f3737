"""Bus events: the envelope and its mapping to documents (``envelope``), applying a batch
idempotently (``apply``, with per-document ``leases``) and the per-event ``results``."""

from batch_ingest.event_types import (
    CHAT_MESSAGE_CREATED,
    DOC_DELETED,
    DOC_UPSERTED,
    EVENT_TYPES,
    FILE_UPLOADED,
    UPSERT_TYPES,
)
from batch_ingest.events.apply import apply_events
from batch_ingest.events.envelope import (
    SUPPORTED_MAJOR,
    EventEnvelope,
    InvalidEvent,
    MappedEvent,
    parse_event,
    parse_ts_ms,
)
from batch_ingest.events.leases import LEASE_TTL_S, LEASE_WAIT_S
from batch_ingest.events.results import (
    EventResult,
    EventStatus,
    IngestEventsResponse,
    count_statuses,
    invalid_result,
)

__all__ = [
    "CHAT_MESSAGE_CREATED",
    "DOC_DELETED",
    "DOC_UPSERTED",
    "EVENT_TYPES",
    "FILE_UPLOADED",
    "LEASE_TTL_S",
    "LEASE_WAIT_S",
    "SUPPORTED_MAJOR",
    "UPSERT_TYPES",
    "EventEnvelope",
    "EventResult",
    "EventStatus",
    "IngestEventsResponse",
    "InvalidEvent",
    "MappedEvent",
    "apply_events",
    "count_statuses",
    "invalid_result",
    "parse_event",
    "parse_ts_ms",
]
