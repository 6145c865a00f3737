"""Checks every input contract shares: text must be valid Unicode and numbers finite.

Python's ``json`` module reads ``NaN``, ``Infinity`` and ``1e999`` (as ``inf``) and keeps a
lone UTF-16 surrogate escape (``"\\ud800"``) as a string no UTF-8 encoder accepts. Typed
string and float fields can refuse these themselves, but values of free-form fields (Cypher
``params``, intent ``args``, graph properties, an event's ``payload``) reach Milvus, Neo4j and
the embedder unchecked; ``invalid_values`` finds them anywhere in a parsed body, and
``reject_invalid_values`` turns what it finds into a pydantic ``ValidationError`` whose
locations name each field (``params.name``, ``documents.0.text``), so the HTTP answer is the
gateway's usual 422.
"""

from __future__ import annotations

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


def invalid_values(value: Any, limit: int = MAX_REPORTED) -> list[tuple[Loc, str, str, str]]:
    """``(location, error type, problem, printable input)`` for each string with a lone
    surrogate (a dict key as well as a value) and each non-finite float in ``value``, in
    document order, at most ``limit``. Walks dicts, lists and tuples without recursion
    (nesting depth is no risk)."""
    found: list[tuple[Loc, str, str, str]] = []
    stack: list[tuple[Loc, Any]] = [((), value)]
    while stack and len(found) < limit:
        loc, item = stack.pop()
        if isinstance(item, str):
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
