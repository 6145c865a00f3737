"""Request and response models of rag.search_docs (docs/data_contracts.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
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
    SourceRef,
    TenantAlias,
    _one_tenant_key,
)

MAX_TOP_K = 100
# Fusion weights multiply normalised scores (0..1, or a rank's 1/(k+rank)) and are summed
# over at most three lists: bounded, no sum or product can overflow to infinity.
MAX_FUSION_WEIGHT = 1000.0


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


class Match(BaseModel):
    score: float
    title: str
    snippet: str
    source_ref: SourceRef
    chunk_id: str
    scores: dict[str, float] | None = None
    # Set when this passage nearly repeats an earlier match of another document (the
    # chunk id of that match): its snippet is then empty, the text being that match's.
    duplicate_of: str | None = None


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
