"""Request and response models of graph.query_context, graph.explain_path and the graph
entity upsert. The spec's ``graph.query_context`` examples (``cypher`` + ``params``, or
``intent`` + ``args``) are the contract."""

from __future__ import annotations

import re
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
from pydantic.json_schema import JsonDict

from batch_ingest.documents import Identifier, OptionalId
from deployments.graph_store.cypher import DEFAULT_PATH_HOPS, NODE_LABELS, RELATIONSHIPS
from deployments.graph_store.guard import RESERVED_PARAMS
from deployments.graph_store.intents import INTENTS
from deployments.validation import NOT_BLANK, SchemaExtra, reject_invalid_values
from serve_app.contracts import TEAM_ALIASES, TenantAlias, _one_tenant_key

# Labels the upsert may write: documents come only through ingestion.
UPSERT_LABELS = tuple(label for label in NODE_LABELS if label != "Doc")
# The schema leaves MicroDAO out: a team's MicroDAO is the team itself, written only with
# ``id`` = the request's team_id (a rule between two fields, which a schema cannot state).
LABEL_SCHEMA = SchemaExtra(
    enum=[label for label in UPSERT_LABELS if label != "MicroDAO"],
    description="The node's label. MicroDAO is accepted too, for the caller's own team only "
    "(id = team_id; 422 otherwise).",
)
PROPERTY_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RESERVED_PROPERTIES = (
    "team_id",
    "id",
    "visibility",
    "stub",
    "derived",
    "wiki_id",
    "wiki_title",
    "acl_allow",
    "acl_deny",
    "acl_restricted",
)
MAX_CYPHER_CHARS = 20_000
Scalar = str | int | float | bool | None


class _TenantRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    team_id: Identifier = Field(validation_alias=TEAM_ALIASES)
    dao_id: TenantAlias = Field(None, exclude=True)
    microdao_id: TenantAlias = Field(None, exclude=True)
    user_id: OptionalId = ""
    agent_id: OptionalId = ""
    visibility: Literal["public", "confidential"] = Field(
        "public", validation_alias=AliasChoices("visibility", "mode")
    )

    # NaN, Infinity and lone surrogates anywhere in the body (Cypher ``params`` and intent
    # ``args`` are free-form): a 422 naming each field, never a Neo4j encoding error.
    _values = model_validator(mode="before")(reject_invalid_values)
    _tenant = model_validator(mode="before")(_one_tenant_key)


def not_blank_strings(schema: Any) -> Any:
    """``schema`` with ``pattern: NOT_BLANK`` on every string that must not be empty: the
    intents' arguments (deployments/graph_store/intents.py, ``Name``) are stripped before their
    ``minLength`` is checked, so "   " is no argument."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and schema.get("minLength", 0) >= 1:
            schema.setdefault("pattern", NOT_BLANK)
        for value in schema.values():
            not_blank_strings(value)
    elif isinstance(schema, list):
        for value in schema:
            not_blank_strings(value)
    return schema


def query_forms() -> list[dict[str, Any]]:
    """The two forms of graph.query_context as JSON Schema ``oneOf`` branches: one per named
    intent (its ``args`` schema from deployments/graph_store/intents.py) and one for Cypher."""
    forms: list[dict[str, Any]] = []
    for name, intent in INTENTS.items():
        args = not_blank_strings(intent.args.model_json_schema())
        args.pop("title", None)
        forms.append(
            {
                "title": name,
                "properties": {
                    "intent": {"const": name},
                    "args": args,
                    "cypher": {"type": "null"},
                    "params": {"type": "object", "maxProperties": 0},
                },
                # An intent with required arguments needs ``args`` (its default is {}).
                "required": ["intent", "args"] if args.get("required") else ["intent"],
            }
        )
    forms.append(
        {
            "title": "cypher",
            "properties": {
                "intent": {"type": "null"},
                "args": {"type": "object", "maxProperties": 0},
                "cypher": {"type": "string", "pattern": NOT_BLANK},
                "params": {"type": "object", "propertyNames": {"not": {"enum": RESERVED_PARAMS}}},
            },
            "required": ["cypher"],
        }
    )
    return forms


def _query_schema(schema: dict[str, Any]) -> None:
    schema["oneOf"] = query_forms()


class GraphQueryRequest(_TenantRequest):
    """graph.query_context: a named ``intent`` with ``args``, or ``cypher`` with ``params``
    (exactly one form: ``oneOf``). An intent's ``args`` follow its own schema (``GET
    /graph/intents``; an unknown intent is 404). ``cypher`` is read-only Cypher for the roles
    of the policy's ``cypher_roles`` (403 for others); Cypher that does not compile, or that
    is not provably read-only and scoped, is 400 — no schema can say which text compiles."""

    model_config = ConfigDict(json_schema_extra=_query_schema)

    intent: Annotated[str, StringConstraints(strip_whitespace=True, max_length=64)] | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    cypher: (
        Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_CYPHER_CHARS)] | None
    ) = None
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_form(self) -> GraphQueryRequest:
        if bool(self.intent) == bool(self.cypher):
            raise ValueError(
                "send exactly one of `intent` (with `args`) or `cypher` (with `params`)"
            )
        if self.intent and self.params:
            raise ValueError("`params` go with `cypher`; an intent takes `args`")
        if self.cypher and self.args:
            raise ValueError("`args` go with `intent`; Cypher takes `params`")
        return self

    @field_validator("params")
    @classmethod
    def _no_reserved(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & set(RESERVED_PARAMS))
        if taken:
            raise ValueError(
                f"params {taken} are set by the gateway from your credential; use other names"
            )
        return value


class GraphQueryResponse(BaseModel):
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    intent: str | None = None
    columns: list[str]
    # One object per row, keyed by column; nodes, relationships and paths are objects with
    # `_type` (see docs/graph_schema.md, "Results").
    rows: list[dict[str, Any]]
    # Rows dropped because they held something outside the caller's scope (second line of
    # defence behind the query's own predicates).
    filtered_rows: int = 0
    took_ms: float
    trace_id: str


class EntityRef(BaseModel):
    """One end of explain_path: an entity's id, name or title, optionally with its label."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ref: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=200),
        SchemaExtra(pattern=NOT_BLANK),
    ] = Field(validation_alias=AliasChoices("ref", "id", "name", "title"))
    label: Literal[NODE_LABELS] | None = None  # type: ignore[valid-type]


def _entity_ref(value: Any) -> Any:
    return {"ref": value} if isinstance(value, str) else value


class ExplainPathRequest(_TenantRequest):
    """graph.explain_path: how two entities are connected inside the caller's scope."""

    source: EntityRef = Field(validation_alias=AliasChoices("from", "source", "from_entity"))
    target: EntityRef = Field(validation_alias=AliasChoices("to", "target", "to_entity"))
    max_hops: int = Field(DEFAULT_PATH_HOPS, ge=1, le=10)
    max_paths: int = Field(3, ge=1, le=100)

    @field_validator("source", "target", mode="before")
    @classmethod
    def _string_or_object(cls, value: Any) -> Any:
        return _entity_ref(value)


class PathOut(BaseModel):
    length: int
    sentence: str
    nodes: list[dict[str, Any]]
    relationships: list[dict[str, Any]]


class ExplainPathResponse(BaseModel):
    degraded: bool = False
    degraded_reasons: list[str] = Field(default_factory=list)
    explanation: str
    paths: list[PathOut]
    source: list[dict[str, Any]]
    target: list[dict[str, Any]]
    filtered_paths: int = 0
    took_ms: float
    trace_id: str


PropertyValue = Scalar | list[str | int | float | bool]
MAX_PROPERTIES = 50
# The schema of ``properties``' keys: what ``_check_properties`` accepts.
PROPERTIES_SCHEMA: JsonDict = {
    "maxProperties": MAX_PROPERTIES,
    "propertyNames": {"pattern": PROPERTY_NAME.pattern, "not": {"enum": list(RESERVED_PROPERTIES)}},
}


def _check_properties(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if not PROPERTY_NAME.match(key):
            raise ValueError(f"property name {key!r} must match {PROPERTY_NAME.pattern}")
        if key in RESERVED_PROPERTIES:
            raise ValueError(f"property {key!r} is set by the gateway")
    if len(value) > MAX_PROPERTIES:
        raise ValueError(f"at most {MAX_PROPERTIES} properties")
    return value


class NodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    label: Annotated[Literal[UPSERT_LABELS], LABEL_SCHEMA]  # type: ignore[valid-type]
    id: Identifier
    name: Annotated[str, StringConstraints(strip_whitespace=True, max_length=500)] | None = None
    visibility: Literal["public", "confidential"] = "public"
    properties: dict[str, PropertyValue] = Field(
        default_factory=dict, json_schema_extra=PROPERTIES_SCHEMA
    )

    _props = field_validator("properties")(_check_properties)


class EndRef(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    label: Annotated[Literal[UPSERT_LABELS], LABEL_SCHEMA]  # type: ignore[valid-type]
    id: Identifier


class RelationshipIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    type: Literal[RELATIONSHIPS]  # type: ignore[valid-type]
    source: EndRef = Field(validation_alias=AliasChoices("from", "source"))
    target: EndRef = Field(validation_alias=AliasChoices("to", "target"))
    visibility: Literal["public", "confidential"] = "public"
    properties: dict[str, PropertyValue] = Field(
        default_factory=dict, json_schema_extra=PROPERTIES_SCHEMA
    )

    _props = field_validator("properties")(_check_properties)


class GraphUpsertRequest(_TenantRequest):
    """POST /graph/entities: entities and relationships (users, agents, resources, USES,
    MEMBER_OF, SERVES, ...) MERGEd into the caller's team; at least one node or relationship
    (``anyOf``). A ``MicroDAO`` node or end is the team itself: its ``id`` must be the
    request's ``team_id`` (422 otherwise)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["nodes"], "properties": {"nodes": {"minItems": 1}}},
                {"required": ["relationships"], "properties": {"relationships": {"minItems": 1}}},
            ]
        }
    )

    nodes: list[NodeIn] = Field(default_factory=list, max_length=1000)
    relationships: list[RelationshipIn] = Field(default_factory=list, max_length=1000)

    @model_validator(mode="after")
    def _something(self) -> GraphUpsertRequest:
        if not self.nodes and not self.relationships:
            raise ValueError("send at least one node or relationship")
        for i, rel in enumerate(self.relationships):
            for end, ref in (("from", rel.source), ("to", rel.target)):
                if ref.label == "MicroDAO" and ref.id != self.team_id:
                    raise ValueError(
                        f"relationships.{i}.{end}: the MicroDAO of a team is its team_id "
                        f"({self.team_id!r})"
                    )
        for i, node in enumerate(self.nodes):
            if node.label == "MicroDAO" and node.id != self.team_id:
                raise ValueError(f"nodes.{i}: the MicroDAO of a team is its team_id")
        return self


class EntityKey(BaseModel):
    label: str
    id: str


class VisibilityChange(BaseModel):
    """An existing node or relationship whose visibility this write set (audited), or a
    node documents had made that is now written directly (``was_derived``)."""

    label: str | None = None
    id: str | None = None
    type: str | None = None
    from_id: str | None = None
    to_id: str | None = None
    before: str | None = None
    after: str
    was_derived: bool = False


class GraphUpsertResponse(BaseModel):
    nodes: int
    relationships: int
    visibility_changes: list[VisibilityChange] = Field(
        default_factory=list,
        description="existing nodes and relationships whose visibility the write changed "
        "(each one audited as graph.visibility)",
    )
    derived_ends: list[EntityKey] = Field(
        default_factory=list,
        description="relationship ends that exist because documents name them: they are "
        "seen only through those documents and go with the last one; write them as nodes "
        "to keep them",
    )
    took_ms: float
    trace_id: str
