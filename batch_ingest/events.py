"""Bus event contracts: the envelope, its mapping to source documents, and applying a batch.

Envelope (DESIGN.md "Bus events"; NATS JetStream subject = the event ``type``,
``<domain>.<sub>.<action>``)::

    {"event_id": "evt-1", "ts": "2026-12-01T10:00:00Z", "domain": "chat",
     "type": "chat.message.created", "version": "1.0",
     "actor": {"id": "u_alice", "kind": "user"},
     "payload": {"message_id": "m-1", "channel_id": "ch_general", "text": "..."},
     "meta": {"team_id": "dao_greenfood", "trace_id": "..."}}

Ingestion types and what they become (docs/data_contracts.md has the full table):

- ``chat.message.created`` → ``SourceDocument(doc_type="message", doc_id=payload.message_id)``;
  a ``user`` actor is the ``author_id``, an ``agent`` actor the ``agent_id``.
- ``doc.upserted`` → ``SourceDocument`` from the payload (``doc_type`` defaults to ``doc``).
- ``file.uploaded`` → ``SourceDocument(doc_type="file", doc_id=payload.file_id)``, ``text`` =
  the extracted text, ``title`` defaults to ``filename``.
- ``doc.deleted`` → delete of ``(team_id, payload.doc_type, payload.doc_id)``.

Rules:

- The tenant is ``meta.team_id`` (alias ``dao_id``/``microdao_id``); a ``team_id`` inside the
  payload must be the same one.
- ``version`` is the envelope's *schema* version, ``"<major>[.<minor>]"``: a major other than
  ``1`` is refused (a consumer must not guess at a format it does not know); minor versions
  may add fields, so unknown payload keys are ignored.
- **Revision (document ordering).** Each event carries a per-document revision: the payload's
  ``revision`` (alias ``version``, a non-negative integer) when the producer keeps one, else
  the envelope ``ts`` in epoch milliseconds. An event is applied only when its revision is
  greater than the one recorded for the document in the source registry
  (``SourceStore.should_apply``): the same event twice, or an older one after a newer one,
  changes nothing. A producer must use one scheme per document (counters are small numbers,
  timestamps huge ones: mixing them lets the timestamp win). Deletes leave a tombstone with
  their revision, so an older upsert delivered late does not bring the document back.
- ``ts`` is ISO-8601 (naive = UTC) or epoch seconds/milliseconds (a number above 10^11 is
  milliseconds).

``parse_event`` validates one raw envelope into a ``MappedEvent`` or an ``InvalidEvent`` (with
422-style ``fields``); ``apply_events`` applies a batch through ``IngestPipeline`` (one
embedding call for all upserts) and returns one ``EventResult`` per event, in order. The HTTP
endpoint ``POST /ingest/events`` and the bus consumer (``batch_ingest.consumer``) share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from batch_ingest.documents import Identifier, OptionalId, SourceDocument, Tag, parse_iso
from batch_ingest.event_types import (  # noqa: F401  (re-exported: the event contract)
    CHAT_MESSAGE_CREATED,
    DOC_DELETED,
    DOC_UPSERTED,
    EVENT_TYPES,
    FILE_UPLOADED,
    UPSERT_TYPES,
)
from batch_ingest.pipeline import IngestPipeline, IngestReport
from batch_ingest.source_store import Key, SourceStore
from deployments.errors import BackendUnavailable

logger = logging.getLogger(__name__)

SUPPORTED_MAJOR = 1
# A writer's lease on a document (seconds), renewed every third of it while its batch runs:
# a writer that dies holds its documents this long at most (the consumer's redelivery
# backoff, 5+15+30+60 s by default, spans it).
LEASE_TTL_S = 60.0
# How long a batch waits for a document another writer is applying before reporting it busy.
LEASE_WAIT_S = 10.0
SUBJECT_RE = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)+$")
# Epoch numbers above this are milliseconds (10^11 s is the year 5138).
_MS_THRESHOLD = 100_000_000_000

EventStatus = Literal["indexed", "unchanged", "skipped_stale", "deleted", "failed", "invalid"]


def parse_ts_ms(value: object) -> int:
    """Epoch milliseconds from ISO-8601 (naive = UTC) or epoch seconds/milliseconds."""
    if isinstance(value, bool) or value is None or value == "":
        raise ValueError("ts is required: ISO-8601 date-time or epoch seconds/milliseconds")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("ts must not be negative")
        return int(value) if value >= _MS_THRESHOLD else int(round(value * 1000))
    if isinstance(value, str):
        return int(parse_iso(value).timestamp() * 1000)
    raise ValueError("ts must be an ISO-8601 date-time or epoch seconds/milliseconds")


class Actor(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: Identifier
    # user | agent | service | system (extensible: a short lowercase word).
    kind: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")


class EventMeta(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    team_id: Identifier = Field(validation_alias=AliasChoices("team_id", "dao_id", "microdao_id"))
    trace_id: str = Field("", max_length=256)


class EventEnvelope(BaseModel):
    """The bus envelope; ``type`` normalised to the full dotted name, ``ts`` to epoch ms."""

    model_config = ConfigDict(extra="forbid")

    event_id: Identifier
    ts: int
    domain: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    type: str
    version: str
    actor: Actor
    payload: dict[str, Any]
    meta: EventMeta

    @field_validator("ts", mode="before")
    @classmethod
    def _ts(cls, value: object) -> int:
        return parse_ts_ms(value)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError('version must be a schema version such as "1" or "1.0"')
        text = str(value).strip()
        if not re.fullmatch(r"\d+(\.\d+){0,2}", text):
            raise ValueError(f'version {text!r} is not a schema version such as "1" or "1.0"')
        major = int(text.split(".")[0])
        if major != SUPPORTED_MAJOR:
            raise ValueError(
                f"schema version {text} is not supported: this consumer reads major version "
                f"{SUPPORTED_MAJOR} (send version {SUPPORTED_MAJOR}.x)"
            )
        return text

    @field_validator("type")
    @classmethod
    def _type_shape(cls, value: str) -> str:
        if not SUBJECT_RE.match(value) and not re.fullmatch(r"[a-z][a-z0-9_-]*", value):
            raise ValueError(f"type {value!r} is not a dotted event name")
        return value

    @model_validator(mode="after")
    def _full_type(self) -> EventEnvelope:
        # "message.created" in domain "chat" is "chat.message.created".
        full = self.type if self.type.startswith(self.domain + ".") else None
        if full is None and f"{self.domain}.{self.type}" in EVENT_TYPES:
            full = f"{self.domain}.{self.type}"
        if full is None:
            raise ValueError(f"type {self.type!r} does not belong to domain {self.domain!r}")
        if full not in EVENT_TYPES:
            raise ValueError(
                f"type {full!r} is not an ingestion event; known: {', '.join(EVENT_TYPES)}"
            )
        self.type = full
        return self


class _Payload(BaseModel):
    # Minor schema versions may add fields: unknown keys are ignored, known ones validated.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    team_id: str | None = Field(None, validation_alias=AliasChoices("team_id", "dao_id"))
    revision: int | None = Field(None, ge=0, validation_alias=AliasChoices("revision", "version"))


class _DocFields(_Payload):
    text: str = Field(min_length=1)
    title: str = ""
    url: str = ""
    project_id: OptionalId = ""
    channel_id: OptionalId = ""
    agent_id: OptionalId = ""
    author_id: OptionalId = ""
    visibility: Literal["public", "confidential"] = Field(
        "public", validation_alias=AliasChoices("visibility", "mode")
    )
    tags: list[Tag] = Field(default_factory=list)
    created_at: Any = None


class MessagePayload(_DocFields):
    message_id: Identifier = Field(validation_alias=AliasChoices("message_id", "doc_id", "id"))


class DocPayload(_DocFields):
    doc_id: Identifier = Field(validation_alias=AliasChoices("doc_id", "id"))
    doc_type: str = "doc"


class FilePayload(_DocFields):
    file_id: Identifier = Field(validation_alias=AliasChoices("file_id", "doc_id", "id"))
    text: str = Field(min_length=1, validation_alias=AliasChoices("text", "extracted_text"))
    filename: str = ""


class DeletePayload(_Payload):
    doc_type: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    doc_id: Identifier = Field(validation_alias=AliasChoices("doc_id", "id"))


PAYLOADS: dict[str, type[_Payload]] = {
    CHAT_MESSAGE_CREATED: MessagePayload,
    DOC_UPSERTED: DocPayload,
    FILE_UPLOADED: FilePayload,
    DOC_DELETED: DeletePayload,
}


@dataclass(frozen=True)
class MappedEvent:
    """A valid event: the document to index (``None`` for a delete), its key and revision."""

    envelope: EventEnvelope
    key: Key
    revision: int
    document: SourceDocument | None

    @property
    def action(self) -> Literal["upsert", "delete"]:
        return "delete" if self.document is None else "upsert"

    @property
    def event_id(self) -> str:
        return self.envelope.event_id


@dataclass(frozen=True)
class InvalidEvent:
    """An envelope that failed validation; ``fields`` in the 422 shape of the gateway."""

    event_id: str
    type: str
    fields: list[dict[str, Any]]

    @property
    def message(self) -> str:
        return "; ".join(f"{f['field']}: {f['problem']}" for f in self.fields)


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
    fields: list[dict[str, Any]] | None = None


class IngestEventsResponse(BaseModel):
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    counts: dict[str, int]
    events: list[EventResult]
    took_ms: float
    trace_id: str


def _fields(
    exc: ValidationError, prefix: tuple[Any, ...] = (), default: str = "event"
) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = (*prefix, *err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))
        msg = msg.removeprefix("Value error, ")
        out.append({"field": ".".join(str(p) for p in loc) or default, "problem": msg})
    return out


def _raw_id(raw: Any, name: str) -> str:
    value = raw.get(name) if isinstance(raw, dict) else None
    return str(value)[:256] if isinstance(value, str | int) else ""


def parse_event(raw: Any) -> MappedEvent | InvalidEvent:
    """Validate one envelope (a dict, JSON text or bytes) and map it; never raises."""
    if isinstance(raw, bytes | str):
        try:
            raw = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return InvalidEvent("", "", [{"field": "event", "problem": f"not JSON: {exc}"}])
    if not isinstance(raw, dict):
        return InvalidEvent("", "", [{"field": "event", "problem": "must be a JSON object"}])
    event_id, etype = _raw_id(raw, "event_id"), _raw_id(raw, "type")
    try:
        env = EventEnvelope.model_validate(raw)
    except ValidationError as exc:
        return InvalidEvent(event_id, etype, _fields(exc, default="type"))
    try:
        payload = PAYLOADS[env.type].model_validate(env.payload)
    except ValidationError as exc:
        return InvalidEvent(env.event_id, env.type, _fields(exc, ("payload",)))
    team = env.meta.team_id
    if payload.team_id is not None and payload.team_id != team:
        return InvalidEvent(
            env.event_id,
            env.type,
            [
                {
                    "field": "payload.team_id",
                    "problem": f"{payload.team_id!r} differs from meta.team_id {team!r}",
                }
            ],
        )
    revision = payload.revision if payload.revision is not None else env.ts
    if isinstance(payload, DeletePayload):
        key = (team, payload.doc_type, payload.doc_id)
        return MappedEvent(env, key, revision, None)
    assert isinstance(payload, _DocFields)  # every other payload is a document's
    try:
        doc = _document(env, payload)
    except ValidationError as exc:
        return InvalidEvent(env.event_id, env.type, _fields(exc, ("payload",)))
    return MappedEvent(env, (doc.team_id, doc.doc_type, doc.doc_id), revision, doc)


def _document(env: EventEnvelope, p: _DocFields) -> SourceDocument:
    actor = env.actor
    fields: dict[str, Any] = {
        "team_id": env.meta.team_id,
        "text": p.text,
        "title": p.title,
        "url": p.url,
        "project_id": p.project_id,
        "channel_id": p.channel_id,
        "agent_id": p.agent_id,
        "author_id": p.author_id,
        "visibility": p.visibility,
        "tags": p.tags,
        # When the payload has no date, the event's time is the document's.
        "created_at": p.created_at if p.created_at not in (None, "") else env.ts // 1000,
    }
    if actor.kind == "user" and not fields["author_id"]:
        fields["author_id"] = actor.id
    if isinstance(p, MessagePayload):
        fields |= {"doc_id": p.message_id, "doc_type": "message"}
        if actor.kind == "agent" and not fields["agent_id"]:
            fields["agent_id"] = actor.id
    elif isinstance(p, FilePayload):
        fields |= {"doc_id": p.file_id, "doc_type": "file", "title": p.title or p.filename}
    else:
        assert isinstance(p, DocPayload)
        fields |= {"doc_id": p.doc_id, "doc_type": p.doc_type}
    return SourceDocument.model_validate(fields)


def subject_type(subject: str, prefix: str = "") -> str:
    """The event type a subject carries (the subject minus the deployment ``prefix``)."""
    return subject[len(prefix) :] if prefix and subject.startswith(prefix) else subject


# --- applying a batch -------------------------------------------------------------------------
def _result(ev: MappedEvent, status: EventStatus, **kw: Any) -> EventResult:
    return EventResult(
        event_id=ev.event_id,
        type=ev.envelope.type,
        team_id=ev.key[0],
        doc_type=ev.key[1],
        doc_id=ev.key[2],
        revision=ev.revision,
        status=status,
        **kw,
    )


def invalid_result(ev: InvalidEvent) -> EventResult:
    return EventResult(
        event_id=ev.event_id, type=ev.type, status="invalid", error=ev.message, fields=ev.fields
    )


async def apply_events(
    pipeline: IngestPipeline,
    events: list[MappedEvent | InvalidEvent],
    *,
    lease_ttl_s: float = LEASE_TTL_S,
    lease_wait_s: float = LEASE_WAIT_S,
) -> tuple[list[EventResult], list[str]]:
    """Apply a batch in revision order per document; one result per event, in input order,
    and the pipeline's degraded reasons.

    Per document only the newest event of the batch is applied, and only when it is newer
    than the registry's revision (``pipeline.sources``; without a registry every event
    applies). All upserts go through one ``pipeline.ingest`` call (one embedding call).

    With a registry, each document's lease (``SourceStore.claim``) is held from the revision
    check to the registry write, so two writers of one document apply its events one after
    the other; a document still leased by another writer after ``lease_wait_s`` is
    ``failed`` ("busy", retried on redelivery). An upsert whose graph write failed is
    ``failed`` as well (its chunks are searchable, ``searchable`` says so): the registry keeps
    the old revision, so the redelivery is applied again and retries the graph.

    Raises:
        BackendUnavailable: Milvus or the embedder failed before anything was written.
    """
    results: list[EventResult | None] = [None] * len(events)
    winners: dict[Key, int] = {}
    for i, ev in enumerate(events):
        if isinstance(ev, InvalidEvent):
            results[i] = invalid_result(ev)
            continue
        best = winners.get(ev.key)
        if best is None or ev.revision > events[best].revision:  # type: ignore[union-attr]
            winners[ev.key] = i
    for i, ev in enumerate(events):
        if isinstance(ev, MappedEvent) and winners[ev.key] != i:
            newest = events[winners[ev.key]]
            assert isinstance(newest, MappedEvent)
            results[i] = _result(
                ev, "unchanged" if ev.revision == newest.revision else "skipped_stale"
            )

    sources = pipeline.sources
    if sources is None or not winners:
        return await _apply_winners(pipeline, events, winners, results)
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    keys = list(winners)
    try:
        # Cancelled mid-batch (consumer stopped or killed), its claims and writes still run
        # on in threads that cannot be stopped: they end before the leases are given back (a
        # lease released under a running claim or write would not protect anything). The
        # batch is not acked; its redelivery finds what was written.
        return await _to_the_end(
            _leased_apply(pipeline, events, winners, results, owner, lease_ttl_s, lease_wait_s)
        )
    finally:
        # Synchronous on purpose: a cancelled batch must still give its leases back, or its
        # documents would wait out the lease TTL. Only this batch's (owner's) rows go.
        try:
            sources.release(keys, owner)
        except Exception as exc:  # expires after lease_ttl_s anyway
            logger.warning("leases not released (they expire): %s", exc)


async def _leased_apply(
    pipeline: IngestPipeline,
    events: list[MappedEvent | InvalidEvent],
    winners: dict[Key, int],
    results: list[EventResult | None],
    owner: str,
    ttl_s: float,
    wait_s: float,
) -> tuple[list[EventResult], list[str]]:
    """Claim the winners' leases, fail the documents still busy, apply the rest while the
    held leases are renewed."""
    sources = pipeline.sources
    assert sources is not None
    held = await _claim(sources, list(winners), owner, ttl_s, wait_s)
    for key in [k for k in winners if k not in held]:
        i = winners.pop(key)
        ev = events[i]
        assert isinstance(ev, MappedEvent)
        results[i] = _result(
            ev,
            "failed",
            error=f"busy: another writer is applying {'/'.join(key)}; retry later",
        )
    renew = asyncio.ensure_future(_renew(sources, list(held), owner, ttl_s))
    try:
        return await _apply_winners(pipeline, events, winners, results)
    finally:
        renew.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renew  # its claim thread, if one runs, ends first


async def _renew(sources: SourceStore, keys: list[Key], owner: str, ttl_s: float) -> None:
    """Extend ``owner``'s leases on ``keys`` every third of ``ttl_s`` until cancelled."""
    while keys:
        await asyncio.sleep(ttl_s / 3)
        try:
            await _in_thread(sources.claim, keys, owner, ttl_s)
        except Exception as exc:  # the leases may lapse; the revision check still holds
            logger.warning("leases not renewed: %s", exc)


async def _to_the_end(aw: Any) -> Any:
    """Await ``aw``; when cancelled, let it end first (threads cannot be stopped), then
    re-raise the cancellation."""
    fut = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await fut
        raise


async def _in_thread(fn: Any, *args: Any) -> Any:
    """``asyncio.to_thread`` whose thread has ended when this returns, cancelled or not (a
    lease claimed by a thread still running after its batch gave the leases back would be
    held until it expires)."""
    return await _to_the_end(asyncio.to_thread(fn, *args))


async def _claim(
    sources: SourceStore, keys: list[Key], owner: str, ttl_s: float, wait_s: float
) -> set[Key]:
    """The leases of ``keys`` that could be taken within ``wait_s`` (polling with backoff)."""
    held: set[Key] = await _in_thread(sources.claim, keys, owner, ttl_s)
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while len(held) < len(keys) and time.monotonic() < deadline:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        missing = [k for k in keys if k not in held]
        held |= await _in_thread(sources.claim, missing, owner, ttl_s)
    return held


async def _apply_winners(
    pipeline: IngestPipeline,
    events: list[MappedEvent | InvalidEvent],
    winners: dict[Key, int],
    results: list[EventResult | None],
) -> tuple[list[EventResult], list[str]]:
    sources = pipeline.sources
    upserts: list[int] = []
    deletes: list[int] = []
    for key, i in winners.items():
        ev = events[i]
        assert isinstance(ev, MappedEvent)
        if sources is not None:
            row = await asyncio.to_thread(sources.get, key)
            if row is not None and row.version is not None and ev.revision <= row.version:
                results[i] = _result(
                    ev, "unchanged" if ev.revision == row.version else "skipped_stale"
                )
                continue
        (deletes if ev.action == "delete" else upserts).append(i)

    degraded: list[str] = []
    if upserts:
        docs = [events[i].document for i in upserts]  # type: ignore[union-attr]
        versions = {events[i].key: events[i].revision for i in upserts}  # type: ignore[union-attr]
        report = await pipeline.ingest(docs, versions)  # type: ignore[arg-type]
        degraded += report.degraded
        by_key = {(r.team_id, r.doc_type, r.doc_id): r for r in report.results}
        for i in upserts:
            ev = events[i]
            assert isinstance(ev, MappedEvent)
            r = by_key.get(ev.key)
            if r is None:
                results[i] = _result(ev, "failed", error="no result from the pipeline")
            elif r.status != "failed" and pipeline.graph is not None and not r.graph:
                results[i] = _result(
                    ev,
                    "failed",
                    chunks=r.chunks,
                    removed_chunks=r.removed_chunks,
                    # Announced once: not again when a redelivery's graph write fails too.
                    searchable=r.status == "indexed",
                    error="chunks indexed but the graph was not updated; "
                    "a redelivery retries the graph",
                )
            else:
                results[i] = _result(
                    ev,
                    r.status,
                    chunks=r.chunks,
                    removed_chunks=r.removed_chunks,
                    graph=r.graph,
                    searchable=r.status == "indexed",
                    error=r.error,
                )
    if deletes:
        keys = [events[i].key for i in deletes]  # type: ignore[union-attr]
        versions = {events[i].key: events[i].revision for i in deletes}  # type: ignore[union-attr]
        removed: IngestReport | None
        try:
            removed = await pipeline.delete(keys, versions)
        except BackendUnavailable as exc:
            removed = None
            error = exc.message
        if removed is not None:
            degraded += removed.degraded
            by_key = {(r.team_id, r.doc_type, r.doc_id): r for r in removed.results}
        for i in deletes:
            ev = events[i]
            assert isinstance(ev, MappedEvent)
            r = by_key.get(ev.key) if removed is not None else None
            if r is None:
                results[i] = _result(ev, "failed", error=error if removed is None else "no result")
            else:
                results[i] = _result(
                    ev,
                    "deleted" if r.status == "deleted" else "failed",
                    removed_chunks=r.removed_chunks,
                    graph=r.graph,
                    error=r.error,
                )
    return [r for r in results if r is not None], degraded


def count_statuses(results: list[EventResult]) -> dict[str, int]:
    statuses = ("indexed", "unchanged", "skipped_stale", "deleted", "failed", "invalid")
    return {s: sum(r.status == s for r in results) for s in statuses}
