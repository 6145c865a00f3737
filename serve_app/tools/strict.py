"""The tools' argument schemas in the subset OpenAI's strict function calling accepts
(``GET /tools?format=openai-strict``, issue 38 item 2): every property required, an optional
one nullable (``null`` means "not given": the runner drops it, so the server's default
applies), no ``default``, ``additionalProperties: false`` on every object, and only the
keywords the subset documents — string ``pattern``/``minLength``/``maxLength`` move into the
description, where the model still reads the limit the server enforces.

Free-form objects cannot be strict: the graph tool's ``args`` become one typed schema per
intent, and its Cypher ``params`` a list of ``{name, value}`` pairs (which the argument model
accepts as well as a mapping). A schema this module cannot make strict raises instead of
being listed loosely."""

from __future__ import annotations

import copy
from typing import Any

from deployments.graph_store.intents import INTENTS
from deployments.validation import plain_schema

# Keywords of the strict subset, per type (OpenAI's "Supported schemas"), plus the
# annotations every type may carry.
COMMON = frozenset({"type", "description", "enum", "const", "anyOf"})
NUMBER = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
ALLOWED: dict[str, frozenset[str]] = {
    "string": frozenset({"format"}),
    "integer": NUMBER,
    "number": NUMBER,
    "boolean": frozenset(),
    "null": frozenset(),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
}
# Types made nullable with a type list (``["string", "null"]``); others with an ``anyOf``.
SCALARS = frozenset({"string", "integer", "number", "boolean"})
# The string formats the subset names.
FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
# One Cypher parameter: the strict shape of a free-form ``params`` mapping.
PARAM_PAIRS: dict[str, Any] = {
    "type": "array",
    "maxItems": 64,
    "description": "Parameters of the Cypher, as name/value pairs.",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "value"],
        "properties": {
            "name": {"type": "string", "description": "The parameter's name, without $."},
            "value": {"type": ["string", "number", "boolean", "null"]},
        },
    },
}


class NotStrict(ValueError):
    """A schema with a part the strict subset cannot express."""


def _describe(schema: dict[str, Any], extra: list[str]) -> None:
    """Append the sentences of ``extra`` to ``schema``'s description."""
    extra = [e for e in extra if e]
    if extra:
        own = schema.get("description", "").rstrip()
        if own and own[-1] not in ".!?)":
            own += "."
        schema["description"] = " ".join(filter(None, [own, *extra]))


def _string_notes(node: dict[str, Any]) -> list[str]:
    notes = []
    if node.get("minLength", 0) > 1:
        notes.append(f"At least {node['minLength']} characters.")
    if "maxLength" in node and node["maxLength"] > 0:
        notes.append(f"At most {node['maxLength']} characters.")
    return notes


def _merge_same_type(branches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """String branches (``""`` or a date-time) as one string schema of their common keys."""
    if len(branches) < 2 or any(b.get("type") != "string" for b in branches):
        return branches
    common = {k: v for k, v in branches[0].items() if all(b.get(k) == v for b in branches)}
    return [common]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null: a type list where that is all it takes, else an ``anyOf``."""
    kind = schema.get("type")
    if isinstance(kind, list):
        if "null" not in kind:
            schema["type"] = [*kind, "null"]
        return schema
    if "anyOf" in schema:
        if not any(b.get("type") == "null" for b in schema["anyOf"]):
            schema["anyOf"].append({"type": "null"})
        return schema
    if kind in SCALARS and "enum" not in schema and "const" not in schema:
        schema["type"] = [kind, "null"]
        return schema
    description = schema.pop("description", None)
    out: dict[str, Any] = {"anyOf": [schema, {"type": "null"}]}
    if description:
        out["description"] = description
    return out


def strict(node: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``node`` (a plain schema: no ``$ref``) in the strict subset.

    Raises:
        NotStrict: an object without declared properties (free-form), or an unknown type.
    """
    node = dict(node)
    notes: list[str] = []
    default = node.pop("default", None)
    if default not in (None, "", [], {}):
        notes.append(f"Default: {default}.")
    if "anyOf" in node:
        branches = [strict(b, where) for b in node.pop("anyOf")]
        nulls = [b for b in branches if b.get("type") == "null"]
        rest = _merge_same_type([b for b in branches if b.get("type") != "null"])
        scalar = len(rest) == 1 and rest[0].get("type") in SCALARS and "enum" not in rest[0]
        if len(rest) == 1 and (scalar or not nulls):
            inner = dict(rest[0])
            _describe(node, [inner.pop("description", "")])
            node = {**inner, **node}
            if nulls:
                node["type"] = [inner["type"], "null"]
        else:
            node["anyOf"] = rest + nulls[:1]
        _describe(node, notes)
        return node
    kind = node.get("type")
    kinds = [str(k) for k in (kind if isinstance(kind, list) else [kind])]
    if not kinds or any(k not in ALLOWED for k in kinds):
        raise NotStrict(f"{where or 'schema'}: type {kind!r} has no strict form")
    if kind == "string":
        notes += _string_notes(node)
        if node.get("format") not in FORMATS:
            node.pop("format", None)
    if kind == "object":
        props = node.get("properties")
        if not props:
            raise NotStrict(f"{where or 'schema'}: a free-form object has no strict form")
        required = set(node.get("required", ()))
        node["properties"] = {
            name: strict(p, f"{where}.{name}") if name in required else _optional(p, where, name)
            for name, p in props.items()
        }
        node["required"] = list(props)
        node["additionalProperties"] = False
    if kind == "array":
        node["items"] = strict(node.get("items") or {}, f"{where}[]")
    keep = COMMON.union(*(ALLOWED[k] for k in kinds))
    out = {k: v for k, v in node.items() if k in keep}
    _describe(out, notes)
    return out


def _optional(prop: dict[str, Any], where: str, name: str) -> dict[str, Any]:
    return _nullable(strict(prop, f"{where}.{name}"))


def intent_args() -> dict[str, Any]:
    """The graph tool's ``args``: one strict object per intent, named in its description."""
    branches = []
    for intent, spec in INTENTS.items():
        branch = strict(plain_schema(spec.args.model_json_schema()), f"args[{intent}]")
        branch["description"] = f"The arguments of {intent}."
        branches.append(branch)
    return {"anyOf": branches, "description": "The arguments of the intent named."}


# Per tool function: properties whose loose schema is replaced before the conversion.
REPLACEMENTS: dict[str, dict[str, Any]] = {
    "graph_query_context": {"args": intent_args, "params": lambda: copy.deepcopy(PARAM_PAIRS)},
}


def strict_parameters(function: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool's argument schema (with the server's bounds) in the strict subset."""
    schema = copy.deepcopy(parameters)
    for name, make in REPLACEMENTS.get(function, {}).items():
        if name in schema.get("properties", {}):
            description = schema["properties"][name].get("description")
            schema["properties"][name] = make()
            if description and name != "params":
                schema["properties"][name]["description"] = description
    return strict(schema, function)
