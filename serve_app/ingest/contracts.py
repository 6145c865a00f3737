"""Request and response models of the ingestion routes: /ingest/documents, /ingest/sync and
the ingestion jobs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from batch_ingest.documents import (
    DOC_TYPE_RE,
    Identifier,
    SourceDocument,
    SourceId,
)
from deployments.validation import reject_invalid_values
from serve_app.contracts import (
    TEAM_ALIASES,
)

# Documents one POST /ingest/sync may keep (a vault of 100,000 notes).
MAX_SYNC_KEEP = 100_000


class IngestDocumentsRequest(BaseModel):
    """POST /ingest/documents: documents with the full metadata schema; each document (a
    ``team_id`` and ``doc_id``, after stripping) at most once per request (422 naming the
    repeat: a schema's ``uniqueItems`` compares whole items, not this key). At most
    ``ingest.max_documents`` documents of at most ``ingest.max_document_chars`` characters."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    documents: list[SourceDocument] = Field(min_length=1)

    _values = model_validator(mode="before")(reject_invalid_values)

    @model_validator(mode="after")
    def _each_document_once(self) -> IngestDocumentsRequest:
        # Two versions of one document in one request are both compared with what is
        # stored before either is written, so the shorter one cannot remove the chunks the
        # longer one leaves: refused, naming every repeat.
        first: dict[tuple[str, str], int] = {}
        errors: list[InitErrorDetails] = []
        for i, doc in enumerate(self.documents):
            key = (doc.team_id, doc.doc_id)
            if key not in first:
                first[key] = i
                continue
            errors.append(
                InitErrorDetails(
                    # No context: the ids stay as sent (a "{" in one is not a placeholder).
                    type=PydanticCustomError(
                        "duplicate_document",
                        f"doc_id {doc.doc_id!r} of team {doc.team_id!r} is already "
                        f"documents.{first[key]}: send each document once per request",
                    ),
                    loc=("documents", i, "doc_id"),
                    input=doc.doc_id,
                )
            )
        if errors:
            raise ValidationError.from_exception_data("IngestDocumentsRequest", errors)
        return self


class IngestedDocument(BaseModel):
    doc_id: str
    team_id: str
    status: Literal["indexed", "unchanged", "failed"]
    chunks: int
    removed_chunks: int = 0
    # Chunks embedded by this request; the others kept their stored vectors (same text and
    # model: a metadata-only change such as an ACL embeds nothing).
    embedded_chunks: int = 0
    graph: bool = False
    error: str | None = None


class IngestDocumentsResponse(BaseModel):
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    indexed: int
    unchanged: int
    failed: int
    documents: list[IngestedDocument]
    took_ms: float
    trace_id: str


class SyncKey(BaseModel):
    """One document a source still has."""

    model_config = ConfigDict(extra="forbid")

    doc_type: str = Field("doc", pattern=DOC_TYPE_RE.pattern)
    doc_id: Identifier


class IngestSyncRequest(BaseModel):
    """POST /ingest/sync: the documents ``source_id`` still has in ``team_id`` (``keep``);
    every other live document of that source in that team is removed, through the same
    delete path as a ``doc.deleted`` event. ``dry_run``: say what would be removed, remove
    nothing."""

    model_config = ConfigDict(extra="forbid")

    team_id: Identifier = Field(validation_alias=TEAM_ALIASES)
    source_id: Annotated[SourceId, StringConstraints(min_length=1)]
    keep: list[SyncKey] = Field(default_factory=list, max_length=MAX_SYNC_KEEP)
    dry_run: bool = False


class SyncedDocument(BaseModel):
    doc_type: str
    doc_id: str
    status: Literal["deleted", "would_delete", "failed"]
    error: str | None = None


class IngestSyncResponse(BaseModel):
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    # Live documents of the source in the team (that this caller may write), before the sync.
    known: int
    kept: int
    removed: int
    failed: int
    documents: list[SyncedDocument]
    # A dry run: the documents of ``keep`` the gateway already has from this source (the
    # others would be new).
    present: list[SyncKey] = Field(default_factory=list)
    dry_run: bool
    took_ms: float
    trace_id: str


class IngestJobAccepted(BaseModel):
    """``202 Accepted``: the documents are stored and will be indexed in the background."""

    job_id: str
    status: str = "queued"
    status_url: str
    documents: int
    chars: int
    trace_id: str


class IngestJobStatus(BaseModel):
    """``GET /ingest/jobs/{job_id}``: queued, running, done (with the ingest result) or
    failed (with the error)."""

    job_id: str
    status: str
    documents: int
    chars: int
    attempts: int
    created_at: str
    updated_at: str
    result: IngestDocumentsResponse | None = None
    error: str | None = None
    trace_id: str
