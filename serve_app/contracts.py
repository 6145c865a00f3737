"""Request and response models of the tool endpoints. The JSON examples of
shared/spec/rag_gateway_task.md are the contract; extra response fields are additions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from batch_ingest.documents import Identifier, OptionalId, SourceDocument, Tag, parse_timestamp

MAX_TOP_K = 100
TEAM_ALIASES = AliasChoices("team_id", "dao_id", "microdao_id")


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

    model_config = ConfigDict(extra="forbid")

    project_id: OptionalId | None = None
    channel_id: OptionalId | None = None
    agent_id: OptionalId | None = None
    doc_type: list[Annotated[str, StringConstraints(min_length=1, max_length=32)]] | None = None
    tags: list[Tag] | None = Field(None, max_length=64)
    # "any": a chunk with at least one of the tags; "all": with every one of them.
    tags_mode: Literal["any", "all"] = "any"
    visibility: Literal["public", "confidential"] | None = None
    created_from: int | None = None
    created_to: int | None = None

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
    model_config = ConfigDict(extra="forbid")

    dense: float = Field(0.5, ge=0.0)
    bm25: float = Field(0.5, ge=0.0)


class SearchDocsRequest(BaseModel):
    """rag.search_docs."""

    # Unknown keys are refused: a misspelled "filter" must not silently widen a search.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    team_id: Identifier = Field(validation_alias=TEAM_ALIASES)
    # Both aliases may be sent; _one_tenant_key checks they agree.
    dao_id: str | None = Field(None, exclude=True)
    microdao_id: str | None = Field(None, exclude=True)
    query: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=8000)]
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
    fusion: Literal["rrf", "weighted"] | None = None
    weights: FusionWeights | None = None
    min_score: float | None = None
    max_context_tokens: int | None = Field(None, ge=1, le=1_000_000)
    rerank: bool | None = None
    explain: bool = False

    _tenant = model_validator(mode="before")(_one_tenant_key)


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


class SearchDocsResponse(BaseModel):
    # Degradation comes first so a truncating caller still sees it.
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    matches: list[Match]
    mode: str
    took_ms: float
    trace_id: str


class IngestDocumentsRequest(BaseModel):
    """POST /ingest/documents: documents with the full metadata schema."""

    model_config = ConfigDict(extra="forbid")

    documents: list[SourceDocument] = Field(min_length=1)


class IngestedDocument(BaseModel):
    doc_id: str
    team_id: str
    status: Literal["indexed", "unchanged", "failed"]
    chunks: int
    removed_chunks: int = 0
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


class ErrorBody(BaseModel):
    error: str
    message: str
    hint: str | None = None
    # 403 only: a short code of the policy decision (team_not_granted, not_in_allowed_groups).
    reason: str | None = None
    fields: list[dict[str, Any]] | None = None
    trace_id: str | None = None
