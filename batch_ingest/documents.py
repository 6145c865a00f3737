"""The source-document contract accepted by ingestion (HTTP today, bus events later)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)

from deployments.acl import MAX_ACL_ENTRIES, allow_tokens, deny_tokens
from deployments.protocols import DOC_TYPES, MAX_ID, MAX_TAG, MAX_TAGS, MAX_TITLE, MAX_URL
from deployments.validation import ID_SCHEMA_PATTERN, NOT_BLANK, SchemaExtra

ID_PATTERN = r"^[^\x00-\x1f]+$"
# The schemas say "not blank" too: the value is stripped before its length is checked.
Identifier = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_ID, pattern=ID_PATTERN),
    SchemaExtra(pattern=ID_SCHEMA_PATTERN),
]
OptionalId = Annotated[
    str, StringConstraints(strip_whitespace=True, max_length=MAX_ID, pattern=r"^[^\x00-\x1f]*$")
]
Tag = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TAG, pattern=ID_PATTERN),
    SchemaExtra(pattern=ID_SCHEMA_PATTERN),
]
DOC_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# A source's id: letters, digits and ``._:-`` (``vault-3f9a…``), or empty (no source).
SOURCE_ID_PATTERN = r"^(?:[A-Za-z0-9][A-Za-z0-9._:-]{0,127})?$"
SourceId = Annotated[str, StringConstraints(strip_whitespace=True, pattern=SOURCE_ID_PATTERN)]
# Text that must hold more than whitespace (a document, a query).
Text = Annotated[str, StringConstraints(min_length=1), SchemaExtra(pattern=NOT_BLANK)]
Title = Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_TITLE)]
Url = Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_URL)]


# Year 1 to year 9999: what Milvus's INT64 column and ISO-8601 round-trip both hold.
MIN_TIMESTAMP = -62_135_596_800
MAX_TIMESTAMP = 253_402_300_799
# An RFC 3339 date-time that is one in Python too, within years 1 to 9999 in UTC (the first
# and last day of that range are left out: an offset can carry them outside it).
DATE_TIME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "format": "date-time",
    "pattern": r"^(?!0000|0001-01-01|9999-12-31)",
}
# A timestamp field: epoch seconds or an ISO-8601 date-time (``parse_timestamp``).
TIMESTAMP_FORMS: list[dict[str, Any]] = [
    {"type": "integer", "minimum": MIN_TIMESTAMP, "maximum": MAX_TIMESTAMP},
    DATE_TIME_SCHEMA,
]
TIMESTAMP_DESCRIPTION = "epoch seconds or an ISO-8601 date-time (naive = UTC), years 1 to 9999"
TIMESTAMP_SCHEMA: dict[str, Any] = {"anyOf": TIMESTAMP_FORMS, "description": TIMESTAMP_DESCRIPTION}
Timestamp = Annotated[int, WithJsonSchema(TIMESTAMP_SCHEMA)]


def parse_iso(value: str) -> datetime:
    """An ISO-8601 date-time as an aware UTC ``datetime`` (``Z`` accepted, also lowercase, as
    RFC 3339 allows; naive means UTC).

    Raises:
        ValueError: naming the value that is not ISO-8601, or outside the years 1 to 9999 in
            UTC.
    """
    text = value.strip()
    if len(text) > 10 and text[10] == "t":
        text = text[:10] + "T" + text[11:]
    if text[-1:] in ("z", "Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an ISO-8601 date-time") from exc
    try:
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError as exc:  # 0001-01-01T00:00+01:00 is in year 0 in UTC
        raise ValueError(f"{value!r} is outside the years 1 to 9999 in UTC") from exc


def parse_timestamp(value: object) -> int:
    """Seconds since the epoch from an int/float or an ISO-8601 string (naive means UTC).

    ``None`` or ``""`` mean "unknown" and give 0, so re-sending a document without a date
    never changes its stored metadata (idempotency).
    """
    if value is None or value == "":
        return 0
    if isinstance(value, bool):
        raise ValueError("must be an ISO-8601 date-time or epoch seconds, not a boolean")
    if isinstance(value, int | float):
        if not math.isfinite(value) or not MIN_TIMESTAMP <= value <= MAX_TIMESTAMP:
            raise ValueError("epoch seconds out of range (years 1 to 9999)")
        return int(value)
    if isinstance(value, str):
        return int(parse_iso(value).timestamp())
    raise ValueError("must be an ISO-8601 date-time or epoch seconds")


class DocumentAcl(BaseModel):
    """Who in the team may read a document (beyond visibility and roles): members of
    ``allowed_groups`` or the ``allowed_users``, never members of ``denied_groups``. Both
    allow lists empty means everyone the team's rules admit (``denied_groups`` still
    applies). Groups are the credential's ``groups`` claim (or API key groups), users its
    subject."""

    model_config = ConfigDict(extra="forbid")

    allowed_groups: list[Identifier] = Field(default_factory=list, max_length=MAX_ACL_ENTRIES)
    allowed_users: list[Identifier] = Field(default_factory=list, max_length=MAX_ACL_ENTRIES)
    denied_groups: list[Identifier] = Field(default_factory=list, max_length=MAX_ACL_ENTRIES)

    @field_validator("allowed_groups", "allowed_users", "denied_groups")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    @property
    def allow(self) -> tuple[str, ...]:
        """The ``acl_allow`` tokens stored on chunks and the graph ``Doc``."""
        return allow_tokens(self.allowed_groups, self.allowed_users)

    @property
    def deny(self) -> tuple[str, ...]:
        return deny_tokens(self.denied_groups)

    @property
    def restricts(self) -> bool:
        return bool(self.allowed_groups or self.allowed_users or self.denied_groups)


class SourceDocument(BaseModel):
    """One document to index, with the full metadata schema of the spec."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    team_id: Identifier = Field(validation_alias=AliasChoices("team_id", "dao_id", "microdao_id"))
    doc_id: Identifier = Field(validation_alias=AliasChoices("doc_id", "id"))
    text: Text
    title: Title = ""
    url: Url = ""
    project_id: OptionalId = ""
    channel_id: OptionalId = ""
    agent_id: OptionalId = ""
    # The user who wrote it; only the graph stores it ((:User)-[:AUTHORED]->(:Doc)).
    author_id: OptionalId = ""
    visibility: Literal["public", "confidential"] = Field(
        "public", validation_alias=AliasChoices("visibility", "mode")
    )
    doc_type: Annotated[str, SchemaExtra(pattern=DOC_TYPE_RE.pattern)] = Field(
        "doc", description=f"a lowercase word: {', '.join(DOC_TYPES)} or another"
    )
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    created_at: Timestamp = Field(default=0, description="ISO-8601 or epoch seconds; 0 = unknown")
    # Document-level access list; None (or an empty one) = the team's rules alone.
    acl: DocumentAcl | None = None
    # The source that owns the document (a vault, a wiki export): ``POST /ingest/sync`` of
    # that source removes its documents the source no longer lists. Kept in the source
    # registry only (not on chunks): a change of source re-embeds nothing.
    source_id: SourceId = ""

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty")
        return value

    @field_validator("doc_type")
    @classmethod
    def _doc_type_known_shape(cls, value: str) -> str:
        # The list is extensible (spec), but a type is a short lowercase word.
        if not DOC_TYPE_RE.match(value):
            raise ValueError(
                f"doc_type must be a lowercase word such as {', '.join(DOC_TYPES)}; got {value!r}"
            )
        return value

    @field_validator("created_at", mode="before")
    @classmethod
    def _parse_created_at(cls, value: object) -> int:
        return parse_timestamp(value)

    @field_validator("tags")
    @classmethod
    def _unique_tags(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @property
    def acl_allow(self) -> tuple[str, ...]:
        return allow_tokens() if self.acl is None else self.acl.allow

    @property
    def acl_deny(self) -> tuple[str, ...]:
        return () if self.acl is None else self.acl.deny

    def metadata_fingerprint(self) -> str:
        """Hash of everything stored beside the text, so a metadata change re-writes chunks.
        ``author_id`` lives only in the graph (merged on every send), so it is left out; an
        empty access list hashes as none (so documents stored before ACLs stay unchanged)."""
        meta = self.model_dump(exclude={"text", "author_id", "acl", "source_id"})
        if self.acl is not None and self.acl.restricts:
            meta["acl"] = self.acl.model_dump()
        return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def make_chunk_id(team_id: str, doc_type: str, doc_id: str, chunk_index: int) -> str:
    """Deterministic chunk id: same tenant, source type, source id and index → same id."""
    key = json.dumps([team_id, doc_type, doc_id, chunk_index], ensure_ascii=False)
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def content_hash(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\x00")
    return digest.hexdigest()
