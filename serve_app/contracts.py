"""The request vocabulary every feature shares: the tenant keys, search filters, source
references, profile info and the error body; each feature's own models are in its
``contracts.py``. The JSON examples of the original specification are the contract
(docs/data_contracts.md); extra response fields are additions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from batch_ingest.documents import (
    OptionalId,
    Tag,
    Timestamp,
    parse_timestamp,
)

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


class SourceRef(BaseModel):
    type: str
    id: str
    url: str
    team_id: str
    doc_type: str
    chunk_index: int


class ProfileInfo(BaseModel):
    """The RAG profile a request ran under (serve_app/profiles.py)."""

    name: str
    rag_mode: str
    # Request values the profile cut (top_k, max_context_tokens, rag_mode, search_mode, ...).
    clamped: list[str] = Field(default_factory=list)


class ErrorBody(BaseModel):
    error: str
    message: str
    hint: str | None = None
    # 403 only: a short code of the policy decision (team_not_granted, not_in_allowed_groups).
    reason: str | None = None
    fields: list[dict[str, Any]] | None = None
    trace_id: str | None = None
