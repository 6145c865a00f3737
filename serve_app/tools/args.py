"""What an LLM chooses when it calls a tool: the question and how much to bring back, never
who is asking. Team, user, agent and the privacy mode come from the credential and the router
(serve_app/tools/tenancy.py); developer knobs (fusion, weights, explain, rerank) stay on the
full HTTP requests of serve_app/contracts.py and serve_app/graph/contracts.py.

Unknown keys are refused, so a model that invents ``team_id`` is told so instead of being
ignored."""

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
)

from batch_ingest.documents import DATE_TIME_SCHEMA, OptionalId, Tag
from deployments.graph_store.intents import INTENTS, catalogue
from deployments.validation import NOT_BLANK, SchemaExtra
from serve_app.contracts import CREATED_RANGE
from serve_app.enrich.contracts import MAX_ENRICH_DOCS
from serve_app.graph.contracts import MAX_CYPHER_CHARS

# The most hits a tool caller gets back (the ADR's cap for tool answers; the HTTP route
# allows search.max_top_k for programs).
MAX_TOOL_TOP_K = 10
Format = Literal["json", "text"]
FORMAT_DOC = (
    '"text": citations as plain text for the model to read (at most 16 KiB, a degraded '
    'warning on the first line); "json": the structured answer.'
)
Text = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=8000),
    SchemaExtra(pattern=NOT_BLANK),
]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# An ISO-8601 date or date-time, or "" for none (the full request parses it).
Stamp = Annotated[
    str,
    StringConstraints(strip_whitespace=True, max_length=64),
    WithJsonSchema({"anyOf": [{"type": "string", "maxLength": 0}, DATE_TIME_SCHEMA]}),
]


class ToolFilters(_Args):
    """Narrowing filters an LLM may set; empty values mean "any". The ids and tags follow the
    full request's rules (serve_app/contracts.py, ``SearchFilters``)."""

    project_id: OptionalId = Field("", description="Only this project.")
    channel_id: OptionalId = Field("", description="Only this chat channel.")
    doc_type: list[Annotated[str, StringConstraints(min_length=1, max_length=32)]] = Field(
        default_factory=list,
        max_length=16,
        description="Only these kinds: doc, wiki, message, file, rwa, transaction.",
    )
    tags: list[Tag] = Field(
        default_factory=list, max_length=64, description="Only passages with one of these tags."
    )
    created_from: Stamp = Field(
        "", description=f"Not older than this ISO-8601 date. {CREATED_RANGE}"
    )
    created_to: Stamp = Field("", description="Not newer than this ISO-8601 date.")

    def search_filters(self) -> dict[str, Any]:
        """The ``filters`` object of the full request (empty values left out)."""
        return {k: v for k, v in self.model_dump().items() if v not in ("", [])}


class SearchDocsArgs(_Args):
    """Search the team's documents (messages, docs, files, wiki pages) for passages about a
    question; each hit comes with its title, url and a snippet to cite (a hit marked
    duplicate_of repeats another hit's text from another source)."""

    query: Text = Field(description="What to look for, in the user's words.")
    top_k: int = Field(
        5,
        ge=1,
        json_schema_extra={"maximum": MAX_TOOL_TOP_K},
        description=f"How many passages to return (at most {MAX_TOOL_TOP_K}; more is cut).",
    )
    filters: ToolFilters = Field(default_factory=ToolFilters, description="Narrow the search.")
    format: Format = Field("json", description=FORMAT_DOC)

    @field_validator("top_k")
    @classmethod
    def _clamp(cls, value: int) -> int:
        """A model asking for more gets the tool's cap, not an error that breaks its loop."""
        return min(value, MAX_TOOL_TOP_K)


class EnrichAnswerArgs(_Args):
    """Check a draft answer against the team's documents: the answer comes back with [n]
    citation markers, the cited sources, and the claims nothing supports."""

    draft_answer: Annotated[
        str, StringConstraints(min_length=1, max_length=20_000), SchemaExtra(pattern=NOT_BLANK)
    ] = Field(description="The answer you intend to give, to be cited claim by claim.")
    question: Annotated[str, StringConstraints(strip_whitespace=True, max_length=8000)] = Field(
        "", description="The question the draft answers (optional)."
    )
    max_docs: int = Field(
        3, ge=1, le=MAX_ENRICH_DOCS, description="Distinct documents to cite at most."
    )
    filters: ToolFilters = Field(
        default_factory=ToolFilters, description="Narrow the documents searched for support."
    )
    format: Format = Field("json", description=FORMAT_DOC)


def _intent_list() -> str:
    """``NAME(arg, ...)``: the intents of deployments/graph_store/intents.py, for the schema."""
    out = []
    for entry in catalogue():
        props = entry["args_schema"].get("properties", {})
        required = set(entry["args_schema"].get("required", ()))
        names = [p if p in required else f"{p}?" for p in props]
        out.append(f"{entry['intent']}({', '.join(names)})")
    return "; ".join(out)


class GraphQueryArgs(_Args):
    """Ask the team's knowledge graph a relationship question: a named intent with its args
    (for example FIND_PROJECTS_BY_TECH with {"tech": "Milvus"}), or read-only Cypher where the
    caller's role allows it."""

    intent: Literal[tuple(INTENTS)] | None = Field(  # type: ignore[valid-type]
        None, description=f"A named intent: {_intent_list()}."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="The intent's arguments.")
    cypher: (
        Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_CYPHER_CHARS)] | None
    ) = Field(
        None,
        description="Read-only Cypher (only for roles allowed to send it); filter every node "
        "with team_id = $team_id.",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the Cypher.")
    format: Format = Field("json", description=FORMAT_DOC)

    @field_validator("intent", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("params", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        """``[{"name": n, "value": v}, ...]`` (the strict listing's shape) as a mapping."""
        if not isinstance(value, list):
            return value
        out: dict[str, Any] = {}
        for pair in value:
            if not (isinstance(pair, dict) and set(pair) == {"name", "value"}):
                raise ValueError('each parameter is {"name": ..., "value": ...}')
            if not isinstance(pair["name"], str) or pair["name"] in out:
                raise ValueError(f"parameter name {pair['name']!r} is not a new string")
            out[pair["name"]] = pair["value"]
        return out


EntityName = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=200),
    SchemaExtra(pattern=NOT_BLANK),
]


class ExplainPathArgs(_Args):
    """Explain how two entities (people, agents, projects, resources, documents) are
    connected in the team's knowledge graph, one sentence per path."""

    source: EntityName = Field(
        validation_alias=AliasChoices("from", "source"),
        serialization_alias="from",
        description="The first entity: its id, name or title.",
    )
    target: EntityName = Field(
        validation_alias=AliasChoices("to", "target"),
        serialization_alias="to",
        description="The second entity: its id, name or title.",
    )
    max_hops: int = Field(4, ge=1, le=6, description="Longest path to consider.")
    max_paths: int = Field(3, ge=1, le=10, description="Paths to return at most.")
    format: Format = Field("json", description=FORMAT_DOC)
