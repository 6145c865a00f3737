"""The compiled search filter: one list of terms, rendered for Milvus and evaluated in memory.

``compile_filter`` turns a ``SearchFilter`` (built only from an ``AccessContext``) into
``CompiledFilter.terms``, always starting with the tenant and visibility terms. The same terms
give the Milvus boolean expression (``CompiledFilter.expr``, every value an escaped JSON string
literal: Milvus Lite does not support ``filter_params`` templates, and an id or tag containing
quotes or operators must never change the expression) and the row masks of the in-memory team
index (``deployments.vector_store.memindex``), so both paths apply exactly one tenancy decision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from deployments.acl import ACL_FIELDS, KEY_OF, OPEN, group_tokens, token_key
from deployments.errors import InvalidInput
from deployments.protocols import SearchFilter

Op = Literal["eq", "in", "any", "all", "none", "ge", "le"]
# Columns a term may name; the in-memory index keeps exactly these.
STRING_FIELDS = ("team_id", "visibility", "project_id", "channel_id", "agent_id", "doc_type")
KEY_FIELDS = (*STRING_FIELDS, "doc_id")
# Array columns a term may name with ``any``/``all``/``none``.
ARRAY_FIELDS = ("tags", *ACL_FIELDS)


def milvus_literal(value: str | int | float | bool) -> str:
    """A Milvus expression literal for ``value`` that cannot break out of its quotes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if not isinstance(value, str):
        raise InvalidInput(f"filter value must be a string, got {type(value).__name__}")
    if any(ord(ch) < 32 for ch in value):
        raise InvalidInput("filter values may not contain control characters")
    return json.dumps(value, ensure_ascii=False)


def milvus_list(values: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(milvus_literal(v) for v in values) + "]"


@dataclass(frozen=True)
class FilterTerm:
    """``field op value``: ``eq``/``in`` on a string column, ``any``/``all``/``none`` on an
    array column (``tags``, the ACL tokens), ``ge``/``le`` on ``created_at``."""

    field: str
    op: Op
    value: str | int | tuple[str, ...]

    def milvus(self) -> str:
        value = self.value
        if self.field in ACL_FIELDS and isinstance(value, tuple):
            return self._acl_milvus(value)
        if isinstance(value, tuple):
            listed = milvus_list(value)
            if self.op == "in":
                return f"{self.field} in {listed}"
            if self.op == "none":
                return f"not array_contains_any({self.field}, {listed})"
            function = "array_contains_any" if self.op == "any" else "array_contains_all"
            return f"{function}({self.field}, {listed})"
        if self.op == "eq":
            return f"{self.field} == {milvus_literal(value)}"
        return f"{self.field} {'>=' if self.op == 'ge' else '<='} {int(value)}"

    def _acl_milvus(self, tokens: tuple[str, ...]) -> str:
        """On the scalar twin of the ACL array: ``key == "*"`` for the open token, ``key like
        "%|<token key>|%"`` for each other one (deployments/acl.py says why not arrays)."""
        for token in tokens:
            milvus_literal(token)  # the same validation as every other value
        key = KEY_OF[self.field]
        parts = [
            f'{key} == "{OPEN}"' if t == OPEN else f'{key} like "%|{token_key(t)}|%"'
            for t in tokens
        ]
        either = "(" + " or ".join(parts) + ")"
        return f"not {either}" if self.op == "none" else either


@dataclass(frozen=True)
class CompiledFilter:
    """The terms of one search's filter (all must hold) and their Milvus expression."""

    team_id: str
    terms: tuple[FilterTerm, ...]
    expr: str

    def milvus_expr(self, *, acl: bool = True) -> str:
        """The expression for a collection with (``acl``) or without the ACL fields; one
        without them holds no document with an access list (the store refuses to write
        one there), so its terms are left out rather than failing on an unknown field."""
        if acl:
            return self.expr
        return " and ".join(t.milvus() for t in self.terms if t.field not in ACL_FIELDS)


def compile_filter(flt: SearchFilter) -> CompiledFilter:
    """Compile a ``SearchFilter``; the tenant and visibility terms are always present, so no
    caller can search without them.

    Raises:
        InvalidInput: no team, no visibility, or a value Milvus could not quote safely.
    """
    if not flt.team_id:
        raise InvalidInput("a search needs a team_id")
    if not flt.visibilities:
        raise InvalidInput("a search needs at least one allowed visibility")
    terms = [FilterTerm("team_id", "eq", flt.team_id)]
    if len(flt.visibilities) == 1:
        terms.append(FilterTerm("visibility", "eq", flt.visibilities[0]))
    else:
        terms.append(FilterTerm("visibility", "in", tuple(flt.visibilities)))
    for name in ("project_id", "channel_id", "agent_id"):
        value = getattr(flt, name)
        if value is not None:
            terms.append(FilterTerm(name, "eq", value))
    if flt.doc_types:
        terms.append(FilterTerm("doc_type", "in", tuple(flt.doc_types)))
    if flt.tags_any:
        terms.append(FilterTerm("tags", "any", tuple(flt.tags_any)))
    if flt.tags_all:
        terms.append(FilterTerm("tags", "all", tuple(flt.tags_all)))
    if flt.created_from is not None:
        terms.append(FilterTerm("created_at", "ge", int(flt.created_from)))
    if flt.created_to is not None:
        terms.append(FilterTerm("created_at", "le", int(flt.created_to)))
    if flt.doc_ids:
        terms.append(FilterTerm("doc_id", "in", tuple(flt.doc_ids)))
    # Document ACLs: one of the caller's tokens allowed, none of its groups denied.
    if not flt.acl_principals:
        raise InvalidInput("a search needs the caller's ACL tokens")
    terms.append(FilterTerm("acl_allow", "any", tuple(flt.acl_principals)))
    groups = group_tokens(flt.acl_principals)
    if groups:
        terms.append(FilterTerm("acl_deny", "none", groups))
    # Rendering validates every value (type, control characters) for both paths.
    expr = " and ".join(term.milvus() for term in terms)
    return CompiledFilter(team_id=flt.team_id, terms=tuple(terms), expr=expr)


def build_filter_expr(flt: SearchFilter, *, acl: bool = True) -> str:
    """The Milvus boolean expression of ``flt`` (see ``compile_filter``); ``acl``: the
    collection has the ACL fields."""
    return compile_filter(flt).milvus_expr(acl=acl)
