"""Checks every input contract shares: text must be valid Unicode, numbers finite and
nesting bounded.

Python's ``json`` module reads ``NaN``, ``Infinity`` and ``1e999`` (as ``inf``) and keeps a
lone UTF-16 surrogate escape (``"\\ud800"``) as a string no UTF-8 encoder accepts. Typed
string and float fields can refuse these themselves, but values of free-form fields (Cypher
``params``, intent ``args``, graph properties, an event's ``payload``) reach Milvus, Neo4j and
the embedder unchecked; ``invalid_values`` finds them anywhere in a parsed body, and
``reject_invalid_values`` turns what it finds into a pydantic ``ValidationError`` whose
locations name each field (``params.name``, ``documents.0.text``), so the HTTP answer is the
gateway's usual 422.

Nesting: a request body (an event envelope, for events) nests at most ``MAX_JSON_DEPTH``
levels of objects and arrays, the body itself being level 1. Free-form values deeper than
that are refused before they go anywhere: a value nested ~900 levels reads fine from JSON but
cannot be pickled to another Ray process (``PicklingError``: the recursion limit) nor encoded
for Neo4j, and no honest request needs more than a few levels.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

# Enough to name the problem fields of any honest request; a body of a million NaNs answers
# with the first ones.
MAX_REPORTED = 20

# json combines a valid surrogate pair into one character, so a surrogate code point left in
# a ``str`` is a lone half: no UTF-8 encoder (Neo4j's, the tokenizer's) takes it.
NOT_UNICODE = "contains a lone UTF-16 surrogate (such as \\ud800): not valid Unicode text"
NOT_FINITE = "must be a finite number, not NaN or Infinity"
# Levels of objects and arrays a request body may nest (the body itself is level 1).
MAX_JSON_DEPTH = 32

Loc = tuple[str | int, ...]
# Stands in the walk for the value of a key that is itself not valid Unicode.
_BAD_KEY = object()


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point (it cannot be encoded as UTF-8)."""
    if text.isascii():
        return False
    try:
        # Three times faster than a regular-expression scan on long non-ASCII text.
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def printable(text: str) -> str:
    """``text`` with any lone surrogate written as its ``\\uXXXX`` escape (safe in UTF-8)."""
    if not has_lone_surrogate(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def too_deep(loc: Loc, max_depth: int) -> tuple[Loc, str, str, str]:
    """The problem of a container at ``loc`` that is one level deeper than ``max_depth``:
    reported on the top-level field it is in, with the path to it (cut short)."""
    shown = ".".join(map(str, loc[:4])) + (".…" if len(loc) > 4 else "")
    problem = (
        f"nests more than {max_depth} levels of objects and arrays (at {shown}, level "
        f"{len(loc) + 1}); a request body may nest at most {max_depth}: flatten the value"
    )
    return (loc[:1], "json_too_deep", problem, shown)


def invalid_values(
    value: Any, limit: int = MAX_REPORTED, max_depth: int | None = MAX_JSON_DEPTH
) -> list[tuple[Loc, str, str, str]]:
    """``(location, error type, problem, printable input)`` for each string with a lone
    surrogate (a dict key as well as a value), each non-finite float and each object or array
    nested deeper than ``max_depth`` levels (``value`` itself is level 1; None: no bound) in
    ``value``, in document order, at most ``limit``. Walks dicts, lists and tuples without
    recursion, and not below ``max_depth``."""
    found: list[tuple[Loc, str, str, str]] = []
    stack: list[tuple[Loc, Any]] = [((), value)]
    while stack and len(found) < limit:
        loc, item = stack.pop()
        if (
            max_depth is not None
            and len(loc) >= max_depth
            and isinstance(item, dict | list | tuple)
        ):
            found.append(too_deep(loc, max_depth))
        elif isinstance(item, str):
            if has_lone_surrogate(item):
                found.append((loc, "string_unicode", NOT_UNICODE, printable(item)[:100]))
        elif isinstance(item, float):
            if not math.isfinite(item):
                found.append((loc, "finite_number", NOT_FINITE, repr(item)))
        elif isinstance(item, dict):
            children: list[tuple[Loc, Any]] = []
            for key, child in item.items():
                name = printable(key) if isinstance(key, str) else key
                children.append(((*loc, name), _BAD_KEY if name != key else child))
            stack.extend(reversed(children))
        elif item is _BAD_KEY:
            found.append((loc, "string_unicode", f"the key {NOT_UNICODE}", str(loc[-1])[:100]))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([((*loc, i), child) for i, child in enumerate(item)]))
    return found[:limit]


def reject_invalid_values(data: Any) -> Any:
    """``data`` unchanged, or a ``ValidationError`` naming every lone surrogate and
    non-finite number in it. Meant as a ``model_validator(mode="before")`` of a request model
    (pydantic puts the locations under the model's own place in a larger body)."""
    problems = invalid_values(data)
    if problems:
        raise ValidationError.from_exception_data(
            "request",
            [
                InitErrorDetails(
                    type=PydanticCustomError(kind, problem),
                    loc=loc,
                    input=shown,
                )
                for loc, kind, problem, shown in problems
            ],
        )
    return data


# --- what the published JSON Schema says ---------------------------------------------------
# A request model's schema (the OpenAPI document, the tool listings) must not promise more
# than the model accepts. Where pydantic's own schema of a constraint is wider than the
# check — a stripped string that must not be empty, a pattern applied after stripping — the
# type carries ``SchemaExtra`` with the exact keywords; the check itself is unchanged.

# The characters ``str.strip()`` removes (``str.isspace``), as a regular-expression class body.
PY_SPACE = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# "Contains a character that is not whitespace": text that stays non-empty after stripping
# (JSON Schema patterns are not anchored).
NOT_BLANK = f"[^{PY_SPACE}]"
# An identifier (no control characters) that is not blank once stripped.
ID_SCHEMA_PATTERN = (
    r"^[^\x00-\x1f]*[^\x00-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
    r"[^\x00-\x1f]*$"
)


class SchemaExtra:
    """``Annotated`` metadata that sets keywords of a type's JSON Schema (over pydantic's
    own), leaving validation alone: ``Annotated[str, StringConstraints(strip_whitespace=True,
    min_length=1), SchemaExtra(pattern=NOT_BLANK)]``."""

    def __init__(self, **keywords: Any) -> None:
        self.keywords = keywords

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = handler(core_schema)
        schema.update(self.keywords)
        return schema

    def __hash__(self) -> int:
        return hash(repr(sorted(self.keywords.items())))


def plain_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``$ref`` to ``$defs`` replaced by its definition and the
    ``title`` keys pydantic adds removed."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = defs[node["$ref"].rsplit("/", 1)[-1]]
                merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
                return walk(merged)
            return {
                k: walk(v)
                for k, v in node.items()
                if k not in ("$defs", "title") or (k == "title" and isinstance(v, dict))
            }
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)
