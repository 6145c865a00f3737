"""Request and response models of rag.enrich_answer (docs/data_contracts.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from batch_ingest.documents import (
    Identifier,
    OptionalId,
)
from deployments.validation import NOT_BLANK, SchemaExtra, reject_invalid_values
from serve_app.contracts import (
    TEAM_ALIASES,
    ProfileInfo,
    SearchFilters,
    TenantAlias,
    _one_tenant_key,
)

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
