"""Request and response models of the tool endpoints. The JSON examples of the original
specification are the contract (docs/data_contracts.md); extra response fields are
additions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from batch_ingest.documents import (
    DOC_TYPE_RE,
    Identifier,
    OptionalId,
    SourceDocument,
    SourceId,
    Tag,
    Timestamp,
    parse_timestamp,
)
from deployments.validation import NOT_BLANK, SchemaExtra, reject_invalid_values

MAX_TOP_K = 100
# Documents one POST /ingest/sync may keep (a vault of 100,000 notes).
MAX_SYNC_KEEP = 100_000
# Fusion weights multiply normalised scores (0..1, or a rank's 1/(k+rank)) and are summed
# over at most three lists: bounded, no sum or product can overflow to infinity.
MAX_FUSION_WEIGHT = 1000.0
TEAM_ALIASES = AliasChoices("team_id", "dao_id", "microdao_id")
# ``dao_id`` and ``microdao_id`` beside ``team_id``: accepted (DESIGN: one tenant key, three
# names), but the schema asks for ``team_id`` alone, since it cannot say "equal to team_id".
TenantAlias = Annotated[
    str | None,
    WithJsonSchema(
        {
            "type": "null",
            "deprecated": True,
            "description": "An alias of team_id (the same tenant key): send team_id. The server "
            "also takes the tenant from dao_id or microdao_id alone, and refuses (422) a "
            "request whose tenant keys name different teams.",
        }
    ),
]
# A JSON Schema cannot compare two fields: the rules below are stated in the descriptions.
CREATED_RANGE = "created_from must not be after created_to (422 otherwise)."


def _one_tenant_key(data: Any) -> Any:
    """``team_id``, ``dao_id`` and ``microdao_id`` name one tenant; two different values fail."""
    if isinstance(data, dict):
        given = {k: data[k] for k in ("team_id", "dao_id", "microdao_id") if data.get(k)}
        if len(set(map(str, given.values()))) > 1:
            raise ValueError(
                "team_id, dao_id and microdao_id name the same tenant and must agree; got "
                + ", ".join(f"{k}={v!r}" for k, v in given.items())
            )
    return data


class SearchFilters(BaseModel):
    """Filters of rag.search_docs. Unknown keys are rejected so a typo never widens a search."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    project_id: OptionalId | None = None
    channel_id: OptionalId | None = None
    agent_id: OptionalId | None = None
    doc_type: list[Annotated[str, StringConstraints(min_length=1, max_length=32)]] | None = None
    tags: list[Tag] | None = Field(None, max_length=64)
    # "any": a chunk with at least one of the tags; "all": with every one of them.
    tags_mode: Literal["any", "all"] = "any"
    visibility: Literal["public", "confidential"] | None = None
    created_from: Timestamp | None = Field(None, description=CREATED_RANGE)
    created_to: Timestamp | None = Field(None, description=CREATED_RANGE)

    @field_validator("doc_type", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("created_from", "created_to", mode="before")
    @classmethod
    def _timestamp(cls, value: Any) -> Any:
        return None if value is None else parse_timestamp(value)

    @model_validator(mode="after")
    def _range_ordered(self) -> SearchFilters:
        if (
            self.created_from is not None
            and self.created_to is not None
            and self.created_from > self.created_to
        ):
            raise ValueError("created_from must not be after created_to")
        return self


class FusionWeights(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dense: float = Field(0.5, ge=0.0, le=MAX_FUSION_WEIGHT)
    bm25: float = Field(0.5, ge=0.0, le=MAX_FUSION_WEIGHT)
    # The learned sparse list (only where the embedder makes it: BGE-M3); unset:
    # search.lexical_weight.
    lexical: float | None = Field(None, ge=0.0, le=MAX_FUSION_WEIGHT)


class GraphOption(BaseModel):
    """Graph-scoped retrieval (docs/graph_schema.md): entities the query names expand to the
    documents linked to them, which are boosted (``boost``) or become the whole search scope
    (``scope``; when the query names no entity in scope the search is not narrowed)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mode: Literal["boost", "scope"] = "boost"
    # Weight of the graph signal beside dense and BM25 (their base weights sum to 1).
    weight: float = Field(0.3, ge=0.0, le=10.0)
    max_entities: int = Field(5, ge=1, le=50)
    max_docs: int = Field(200, ge=1, le=5000)


class GraphInfo(BaseModel):
    mode: str
    entities: list[dict[str, Any]]
    linked_docs: int
    applied: bool
    note: str | None = None


def _graph_shorthand_schema(schema: dict[str, Any]) -> None:
    # ``graph`` also takes "boost" / "scope" and true / false (``_graph_shorthand``).
    graph = schema.get("properties", {}).get("graph", {})
    graph.get("anyOf", []).extend([{"enum": ["boost", "scope"]}, {"type": "boolean"}])


class SearchDocsRequest(BaseModel):
    """rag.search_docs."""

    # Unknown keys are refused: a misspelled "filter" must not silently widen a search.
    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        allow_inf_nan=False,
        json_schema_extra=_graph_shorthand_schema,
    )

    team_id: Identifier = Field(validation_alias=TEAM_ALIASES)
    # Both aliases may be sent; _one_tenant_key checks they agree.
    dao_id: TenantAlias = Field(None, exclude=True)
    microdao_id: TenantAlias = Field(None, exclude=True)
    # The schema's maxLength is search.max_query_chars (serve_app/openapi.py).
    query: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=8000),
        SchemaExtra(pattern=NOT_BLANK),
    ]
    # None = the configured search.default_top_k.
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K)
    agent_id: OptionalId = ""
    user_id: OptionalId = ""
    filters: SearchFilters = Field(default_factory=SearchFilters)
    # The caller's privacy mode: "confidential" widens the search to confidential chunks.
    visibility: Literal["public", "confidential"] = Field(
        "public", validation_alias=AliasChoices("visibility", "mode")
    )
    search_mode: Literal["hybrid", "dense", "bm25"] | None = None
    fusion: Literal["rrf", "weighted", "adaptive"] | None = None
    weights: FusionWeights | None = None
    min_score: FiniteFloat | None = None
    max_context_tokens: int | None = Field(None, ge=1, le=1_000_000)
    rerank: bool | None = None
    explain: bool = False
    # Graph-scoped retrieval: {"mode": "boost"|"scope", ...} or just "boost" / "scope".
    graph: GraphOption | None = None
    # Narrow the agent's RAG profile (off < light < strict); never widens it.
    rag_mode: Literal["off", "light", "strict"] | None = None

    # NaN, Infinity and lone surrogates anywhere in the body: a 422 naming each field.
    _values = model_validator(mode="before")(reject_invalid_values)
    _tenant = model_validator(mode="before")(_one_tenant_key)

    @field_validator("graph", mode="before")
    @classmethod
    def _graph_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"mode": value}
        if value is True:
            return {}
        return None if value is False else value


class SourceRef(BaseModel):
    type: str
    id: str
    url: str
    team_id: str
    doc_type: str
    chunk_index: int


class Match(BaseModel):
    score: float
    title: str
    snippet: str
    source_ref: SourceRef
    chunk_id: str
    scores: dict[str, float] | None = None


class ProfileInfo(BaseModel):
    """The RAG profile a request ran under (serve_app/profiles.py)."""

    name: str
    rag_mode: str
    # Request values the profile cut (top_k, max_context_tokens, rag_mode, search_mode, ...).
    clamped: list[str] = Field(default_factory=list)


class CacheInfo(BaseModel):
    """Whether the answer came from the semantic cache (serve_app/search/cache/)."""

    hit: bool
    # "hit", "miss", "near_refused" (a miss: a near-duplicate query's answer was found but
    # its words disagree with this query's, cache.near_check), "bypass" (not cached for this
    # profile) or "unavailable: <reason>".
    status: str
    backend: str
    # Hits only: 1.0 for an exact repeat, else the cosine of the two queries; seconds old.
    similarity: float | None = None
    age_s: float | None = None


class SearchDocsResponse(BaseModel):
    # Degradation comes first so a truncating caller still sees it.
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    matches: list[Match]
    mode: str
    # What graph-scoped retrieval found and did (only when the request asked for it).
    graph: GraphInfo | None = None
    profile: ProfileInfo | None = None
    cache: CacheInfo | None = None
    # Why there are no matches without a search (rag_mode off).
    notice: str | None = None
    took_ms: float
    trace_id: str


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


class ErrorBody(BaseModel):
    error: str
    message: str
    hint: str | None = None
    # 403 only: a short code of the policy decision (team_not_granted, not_in_allowed_groups).
    reason: str | None = None
    fields: list[dict[str, Any]] | None = None
    trace_id: str | None = None


# --- rag.enrich_answer ---------------------------------------------------------------------
MAX_ENRICH_DOCS = 20
# The hard ceiling of the schema; the configured enrich.max_draft_chars is checked after it.
MAX_DRAFT_CHARS = 100_000


class EnrichAnswerRequest(BaseModel):
    """rag.enrich_answer: find support for each claim of ``draft_answer`` in the caller's
    tenant. Scope fields (team, user, agent, mode, filters) work as in rag.search_docs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    team_id: Identifier = Field(validation_alias=TEAM_ALIASES)
    dao_id: TenantAlias = Field(None, exclude=True)
    microdao_id: TenantAlias = Field(None, exclude=True)
    # The question the draft answers; recorded (hashed) in the audit log, not searched.
    question: Annotated[str, StringConstraints(strip_whitespace=True, max_length=8000)] = ""
    # Kept verbatim (no stripping): citation markers are inserted at offsets of this text.
    # The schema's maxLength is enrich.max_draft_chars (serve_app/openapi.py).
    draft_answer: Annotated[
        str,
        StringConstraints(min_length=1, max_length=MAX_DRAFT_CHARS),
        SchemaExtra(pattern=NOT_BLANK),
    ]
    # Distinct source documents cited at most.
    max_docs: int = Field(3, ge=1, le=MAX_ENRICH_DOCS)
    agent_id: OptionalId = ""
    user_id: OptionalId = ""
    filters: SearchFilters = Field(default_factory=SearchFilters)
    visibility: Literal["public", "confidential"] = Field(
        "public", validation_alias=AliasChoices("visibility", "mode")
    )
    # Narrow the agent's RAG profile (off < light < strict); never widens it.
    rag_mode: Literal["off", "light", "strict"] | None = None

    _values = model_validator(mode="before")(reject_invalid_values)
    _tenant = model_validator(mode="before")(_one_tenant_key)

    @field_validator("draft_answer")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("draft_answer must contain text")
        return value


class EnrichSource(BaseModel):
    """One cited document; ``marker`` is its number in the ``[n]`` markers."""

    id: str
    title: str
    url: str
    marker: int
    team_id: str
    doc_type: str
    chunk_index: int
    chunk_id: str
    score: float
    snippet: str


class EnrichClaim(BaseModel):
    text: str
    supported: bool
    # Cited documents (ids of ``sources``) and their marker numbers.
    source_ids: list[str]
    markers: list[int]
    # The best support score found for the claim, cited or not (0..1).
    score: float
    # Character offsets of the claim in draft_answer.
    start: int
    end: int
    # Unsupported claims only: "no_support" or "over_max_docs" (support exists, but only in
    # documents beyond max_docs).
    reason: str | None = None


class EnrichAnswerResponse(BaseModel):
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    enriched_answer: str
    sources: list[EnrichSource]
    claims: list[EnrichClaim]
    unsupported_claims: list[str]
    # Claims beyond enrich.max_claims: neither checked nor marked.
    skipped_claims: int = 0
    mode: str
    profile: ProfileInfo | None = None
    notice: str | None = None
    took_ms: float
    trace_id: str
