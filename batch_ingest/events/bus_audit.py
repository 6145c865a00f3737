"""The audit record of every bus write, written before the write is applied.

The gateway audits each event of ``POST /ingest/events`` (action ``ingest.events``); the bus
consumer audits each event it takes off the stream the same way, in the same table
(``audit.url``), as action ``bus.events``:

- ``subject``: the producer the subject names (``rag.team.<team>.<type>.<producer>``), which
  the bus's subject permissions bind to that producer's credential; ``""`` for an event
  published without one (only the service users, the consumer and operators, may do that on
  an authenticated bus). ``auth_method`` is ``nkey`` when the consumer itself connects with a
  credential (so the bus enforces the permissions), else ``none`` (the name is only claimed).
- ``decision``: ``allow`` (``granted``, status 200) for a valid event on its own team's
  subject; ``deny`` for one published on another team's subject (``team_subject``, 403) or
  that does not parse (``invalid_event``, 422). Denied events go to the dead-letter stream.
- ``team_id`` and ``resource`` (``team:<team>/<doc_type>:<doc_id>/<type>@<revision>``), the
  NATS subject in ``path``, the event's ``trace_id``.

The records of a batch are inserted in one transaction before it is applied; when that fails
the batch is not applied and waits for the database like any other outage (the consumer naks
it as retryable). A message's record is written once: a redelivery of a message already
audited (an outage of Milvus, say) adds none.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from batch_ingest.audit_store import AuditRecord, AuditStore
from batch_ingest.event_types import parse_subject
from batch_ingest.events.envelope import InvalidEvent, MappedEvent
from batch_ingest.settings import AuditSettings

ACTION = "bus.events"
# Stream sequences of messages already audited, kept for redeliveries.
REMEMBERED = 100_000


class BusAudit:
    """Writes the audit records of a batch of bus messages (see the module docstring)."""

    def __init__(
        self,
        settings: AuditSettings,
        *,
        authenticated: bool,
        subject_prefix: str = "",
        store: AuditStore | None = None,
    ) -> None:
        self.store = store or AuditStore(settings.url, settings.table)
        self.auth_method = "nkey" if authenticated else "none"
        self.prefix = subject_prefix
        self._done: collections.OrderedDict[Any, None] = collections.OrderedDict()

    def record(self, msg: Any, ev: MappedEvent | InvalidEvent) -> AuditRecord:
        """The record of one message."""
        parts = parse_subject(msg.subject, self.prefix)
        fields: dict[str, Any] = {
            "action": ACTION,
            "subject": parts.producer,
            "auth_method": self.auth_method,
            "trace_id": ev.trace_id,
            "path": msg.subject[:256],
        }
        if isinstance(ev, MappedEvent):
            team, doc_type, doc_id = ev.key
            resource = f"team:{team}/{doc_type}:{doc_id}/{ev.envelope.type}@{ev.revision}"
            return AuditRecord(
                decision="allow",
                reason="granted",
                http_status=200,
                team_id=team,
                resource=resource[:2000],
                doc_ids=[doc_id],
                **fields,
            )
        other_team = any(f.get("field") == "meta.team_id" for f in ev.fields)
        return AuditRecord(
            decision="deny",
            reason="team_subject" if other_team else "invalid_event",
            http_status=403 if other_team else 422,
            team_id=parts.team or "",
            resource=f"event:{ev.event_id}/{ev.type}"[:2000],
            **fields,
        )

    async def write(self, msgs: list[Any], parsed: list[MappedEvent | InvalidEvent]) -> None:
        """Insert the records of the messages not audited yet; raises what the database
        raised (nothing is remembered then)."""
        todo = [(m, ev) for m, ev in zip(msgs, parsed, strict=True) if _key(m) not in self._done]
        if not todo:
            return
        records = [self.record(m, ev) for m, ev in todo]
        await asyncio.to_thread(self.store.insert, records)
        for m, _ in todo:
            self._done[_key(m)] = None
        while len(self._done) > REMEMBERED:
            self._done.popitem(last=False)

    def close(self) -> None:
        self.store.dispose()


def _key(msg: Any) -> Any:
    """A message's identity across redeliveries: its stream sequence (the object itself for a
    message without JetStream metadata)."""
    try:
        return (msg.metadata.stream, msg.metadata.sequence.stream)
    except Exception:  # noqa: BLE001 (a plain message: no redelivery to recognise)
        return ("obj", id(msg))
