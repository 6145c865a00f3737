"""Bus event contracts: the envelope, its mapping to source documents, and applying a batch.

Envelope (docs/data_contracts.md, "Bus events"; NATS JetStream subject = the event ``type``,
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

- The tenant is ``meta.team_id`` (alias ``dao_id``/``microdao_id``); every team the payload
  names must be the same one: ``team_id``, ``dao_id`` or ``microdao_id`` at any depth (the
  payload's own, a document inside it such as ``payload.document.team_id``, each of a list
  such as ``payload.documents.0.team_id``). Another team is ``invalid`` naming that field.
- No string of the envelope may hold a lone UTF-16 surrogate and no number may be NaN or
  Infinity (``invalid``, naming the field).
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
- ``meta.trace_id`` (at most 256 characters, optional) is the producer's trace id: each
  event's result carries it (``EventResult.trace_id``), the consumer logs the event under it
  and its ``rag.document.indexed`` / ``rag.document.deleted`` notification repeats it.

``parse_event`` validates one raw envelope into a ``MappedEvent`` or an ``InvalidEvent`` (with
422-style ``fields``); ``apply_events`` applies a batch through ``IngestPipeline`` (one
embedding call for all upserts) and returns one ``EventResult`` per event, in order. The HTTP
endpoint ``POST /ingest/events`` and the bus consumer (``batch_ingest.consumer``) share it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from batch_ingest.documents import (
    DATE_TIME_SCHEMA,
    DOC_TYPE_RE,
    MAX_TIMESTAMP,
    TIMESTAMP_DESCRIPTION,
    TIMESTAMP_FORMS,
    DocumentAcl,
    Identifier,
    OptionalId,
    SourceDocument,
    Tag,
    Text,
    Title,
    Url,
    parse_iso,
)
from batch_ingest.event_types import (
    CHAT_MESSAGE_CREATED,
    DOC_DELETED,
    DOC_UPSERTED,
    EVENT_TYPES,
    FILE_UPLOADED,
    canonical_type,
)
from batch_ingest.source_store import Key
from deployments.protocols import MAX_TAGS, MAX_TITLE
from deployments.validation import SchemaExtra, invalid_values, plain_schema, printable

SUPPORTED_MAJOR = 1
# The keys that name a tenant (the aliases of meta.team_id).
TEAM_KEYS = ("team_id", "dao_id", "microdao_id")
SUBJECT_RE = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)+$")
# Epoch numbers above this are milliseconds (10^11 s is the year 5138).
_MS_THRESHOLD = 100_000_000_000
# The largest revision: an integer every JSON reader holds exactly (2^53 - 1; epoch
# milliseconds of year 9999 are 2.5 x 10^14), and far below the registry's 64-bit column.
MAX_REVISION = 2**53 - 1
DOC_TYPE_PATTERN = DOC_TYPE_RE.pattern


def parse_ts_ms(value: object) -> int:
    """Epoch milliseconds from ISO-8601 (naive = UTC) or epoch seconds/milliseconds."""
    if isinstance(value, bool) or value is None or value == "":
        raise ValueError("ts is required: ISO-8601 date-time or epoch seconds/milliseconds")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("ts must be a finite number")
        if value < 0:
            raise ValueError("ts must not be negative")
        ms = int(value) if value >= _MS_THRESHOLD else int(round(value * 1000))
        if ms > MAX_TIMESTAMP * 1000 + 999:
            raise ValueError("ts is after the year 9999")
        return ms
    if isinstance(value, str):
        return int(parse_iso(value).timestamp() * 1000)
    raise ValueError("ts must be an ISO-8601 date-time or epoch seconds/milliseconds")


class Actor(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: Identifier
    # user | agent | service | system (extensible: a short lowercase word).
    kind: str = Field(pattern=DOC_TYPE_PATTERN)


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
        # "message.created" in domain "chat" is "chat.message.created"; the specification's
        # spellings ("doc.upsert") stand for the types they name.
        self.type = canonical_type(self.type)
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
    # The teams a payload names are checked against meta.team_id by ``_foreign_teams``.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    revision: int | None = Field(
        None, ge=0, le=MAX_REVISION, validation_alias=AliasChoices("revision", "version")
    )


class _DocFields(_Payload):
    # The document's own constraints (batch_ingest/documents.py), checked here already.
    text: Text
    title: Title = ""
    url: Url = ""
    project_id: OptionalId = ""
    channel_id: OptionalId = ""
    agent_id: OptionalId = ""
    author_id: OptionalId = ""
    visibility: Literal["public", "confidential"] = Field(
        "public", validation_alias=AliasChoices("visibility", "mode")
    )
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    # Unset: the event's ts.
    created_at: Annotated[
        Any,
        WithJsonSchema(
            {"anyOf": [*TIMESTAMP_FORMS, {"type": "null"}], "description": TIMESTAMP_DESCRIPTION}
        ),
    ] = None
    acl: DocumentAcl | None = None


class MessagePayload(_DocFields):
    message_id: Identifier = Field(validation_alias=AliasChoices("message_id", "doc_id", "id"))


class DocPayload(_DocFields):
    doc_id: Identifier = Field(validation_alias=AliasChoices("doc_id", "id"))
    doc_type: Annotated[str, SchemaExtra(pattern=DOC_TYPE_PATTERN)] = "doc"


class FilePayload(_DocFields):
    file_id: Identifier = Field(validation_alias=AliasChoices("file_id", "doc_id", "id"))
    text: Text = Field(validation_alias=AliasChoices("text", "extracted_text"))
    # The title when none is given (so at most a title's length).
    filename: Annotated[str, SchemaExtra(maxLength=MAX_TITLE)] = ""


class DeletePayload(_Payload):
    doc_type: str = Field(pattern=DOC_TYPE_PATTERN)
    doc_id: Identifier = Field(validation_alias=AliasChoices("doc_id", "id"))


PAYLOADS: dict[str, type[_Payload]] = {
    CHAT_MESSAGE_CREATED: MessagePayload,
    DOC_UPSERTED: DocPayload,
    FILE_UPLOADED: FilePayload,
    DOC_DELETED: DeletePayload,
}


def envelope_schema() -> dict[str, Any]:
    """The JSON Schema of one envelope as ``parse_event`` accepts it (narrower where the
    rules are lenient: only the full dotted ``type`` names, not their aliases), with the
    payload of each type (``oneOf``). What no schema can say is in its description."""

    def schema(model: type[BaseModel]) -> dict[str, Any]:
        return plain_schema(model.model_json_schema())

    payloads = []
    for event_type, model in PAYLOADS.items():
        payload = schema(model)
        # The team is meta.team_id; a payload naming it again must name the same one, which
        # a schema cannot compare: it asks for none.
        for key in TEAM_KEYS:
            payload["properties"][key] = {"type": "null"}
        payloads.append(
            {
                "title": event_type,
                "properties": {
                    "domain": {"const": event_type.split(".")[0]},
                    "type": {"const": event_type},
                    "payload": payload,
                },
            }
        )
    return {
        "type": "object",
        "description": 'A bus envelope (docs/data_contracts.md, "Bus events"): the payload of its '
        "type. The team is meta.team_id (a team the credential grants, else 403); team_id, "
        "dao_id or microdao_id anywhere in the payload must name that same team (422 "
        "otherwise). A revision (payload revision, else ts in ms) orders the events of one "
        "document.",
        "additionalProperties": False,
        "required": list(EventEnvelope.model_fields),
        "properties": {
            "event_id": schema(_EventId)["properties"]["event_id"],
            "ts": {
                "anyOf": [
                    DATE_TIME_SCHEMA,
                    {"type": "integer", "minimum": 0, "maximum": MAX_TIMESTAMP * 1000 + 999},
                ],
                "description": "ISO-8601, or epoch seconds (milliseconds above 10^11)",
            },
            "domain": {"type": "string"},
            "type": {"type": "string"},
            "version": {
                "anyOf": [
                    {"type": "string", "pattern": f"^{SUPPORTED_MAJOR}(\\.[0-9]+){{0,2}}$"},
                    {"type": "integer", "const": SUPPORTED_MAJOR},
                ],
                "description": f"the envelope's schema version, major {SUPPORTED_MAJOR}",
            },
            "actor": schema(Actor),
            "payload": {"type": "object"},
            "meta": schema(EventMeta),
        },
        "oneOf": payloads,
    }


class _EventId(BaseModel):
    event_id: Identifier


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

    @property
    def trace_id(self) -> str:
        """The producer's ``meta.trace_id`` (``""`` when it sent none)."""
        return self.envelope.meta.trace_id


@dataclass(frozen=True)
class InvalidEvent:
    """An envelope that failed validation; ``fields`` in the 422 shape of the gateway;
    ``trace_id`` its ``meta.trace_id`` when that one is a string (``""`` otherwise)."""

    event_id: str
    type: str
    fields: list[dict[str, Any]]
    trace_id: str = ""

    @property
    def message(self) -> str:
        return "; ".join(f"{f['field']}: {f['problem']}" for f in self.fields)


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
    return printable(str(value)[:256]) if isinstance(value, str | int) else ""


def _raw_trace_id(raw: dict[str, Any]) -> str:
    meta = raw.get("meta")
    value = meta.get("trace_id") if isinstance(meta, dict) else None
    return printable(value[:256]) if isinstance(value, str) else ""


def _foreign_teams(payload: dict[str, Any], team: str) -> list[dict[str, Any]]:
    """A field for each place of ``payload`` (at any depth: a document inside it, a list of
    documents) where ``team_id``, ``dao_id`` or ``microdao_id`` names another team than
    ``team`` (``meta.team_id``); ``null`` names none."""
    out: list[dict[str, Any]] = []
    stack: list[tuple[str, Any]] = [("payload", payload)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed([(f"{path}.{i}", v) for i, v in enumerate(item)]))
            continue
        if not isinstance(item, dict):
            continue
        children = []
        for key, value in item.items():
            if key in TEAM_KEYS and value is not None:
                if not isinstance(value, str) or value.strip() != team:
                    out.append(
                        {
                            "field": f"{path}.{key}",
                            "problem": f"{repr(value)[:100]} differs from meta.team_id "
                            f"{team!r}: an event writes only into its own team",
                        }
                    )
            elif isinstance(value, dict | list):
                children.append((f"{path}.{key}", value))
        stack.extend(reversed(children))
    return out


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
    trace_id = _raw_trace_id(raw)
    bad = invalid_values(raw)
    if bad:
        fields = [{"field": ".".join(map(str, loc)), "problem": msg} for loc, _, msg, _ in bad]
        return InvalidEvent(event_id, etype, fields, trace_id)
    try:
        env = EventEnvelope.model_validate(raw)
    except ValidationError as exc:
        return InvalidEvent(event_id, etype, _fields(exc, default="type"), trace_id)
    team = env.meta.team_id
    foreign = _foreign_teams(env.payload, team)
    if foreign:
        return InvalidEvent(env.event_id, env.type, foreign, trace_id)
    try:
        payload = PAYLOADS[env.type].model_validate(env.payload)
    except ValidationError as exc:
        return InvalidEvent(env.event_id, env.type, _fields(exc, ("payload",)), trace_id)
    revision = payload.revision if payload.revision is not None else env.ts
    if isinstance(payload, DeletePayload):
        key = (team, payload.doc_type, payload.doc_id)
        return MappedEvent(env, key, revision, None)
    assert isinstance(payload, _DocFields)  # every other payload is a document's
    try:
        doc = _document(env, payload)
    except ValidationError as exc:
        return InvalidEvent(env.event_id, env.type, _fields(exc, ("payload",)), trace_id)
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
        "acl": p.acl,
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
