"""Proof that a caller's Cypher is read-only and stays inside one tenant's scope.

The gateway never runs caller Cypher blind. Before it runs, ``EXPLAIN`` gives the query type
and the plan, and ``check_plan`` proves on that plan (see docs/graph_schema.md, "Raw Cypher"):

1. **Read-only**: the query type is ``r`` and no operator writes, loads files (``LoadCSV``) or
   calls a procedure outside ``ALLOWED_PROCEDURES``.
2. **Tenant scope**: every node variable the plan binds (a scan, a seek, an expansion, a
   procedure yield) is constrained by the conjunct ``v.team_id = $team_id`` — in its own index
   seek or in a ``Filter`` above it whose rows still carry it — and is bound only once, so
   that constraint cannot belong to a different binding of the same name. Nodes reached along
   relationships are then in the team too: the gateway only writes relationships whose two
   ends are in one team (docs/graph_schema.md).
3. **Visibility**, when the caller may not see every visibility: the same, with
   ``v.visibility IN $visibilities`` for every node *and* relationship variable; variable
   length patterns (whose inner nodes cannot be constrained this way) are refused then.

``$team_id`` and ``$visibilities`` are set by the gateway from the AccessContext, never by the
caller. Operators the checker does not know are refused: an unknown shape is never assumed
safe. Each returned node, relationship and path is filtered again after the run
(``deployments.graph``), as a second line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from deployments.errors import Forbidden

RESERVED_PARAMS = ("team_id", "visibilities")

# Read-only procedures a caller may use; their NODE / RELATIONSHIP yields need the same
# scope predicates as any other binding.
ALLOWED_PROCEDURES = (
    "db.index.fulltext.queryNodes",
    "db.index.fulltext.queryRelationships",
)

# Operators whose right side only tests a pattern (or its absence): a relationship found
# there says nothing about the rows that come out.
EXISTENTIAL = frozenset(
    {
        "SemiApply",
        "AntiSemiApply",
        "SelectOrSemiApply",
        "SelectOrAntiSemiApply",
        "LetSemiApply",
        "LetAntiSemiApply",
        "LetSelectOrSemiApply",
        "LetSelectOrAntiSemiApply",
        "RollUpApply",
        "ConditionalApply",
        "AntiConditionalApply",
        "Anti",
    }
)
# Operators that bind no new node or relationship (they filter, project, join, sort, page).
PASS_THROUGH = (
    frozenset(
        {
            "ProduceResults",
            "Filter",
            "Projection",
            "Limit",
            "ExhaustiveLimit",
            "Skip",
            "Sort",
            "Top",
            "Top1WithTies",
            "PartialSort",
            "PartialTop",
            "Distinct",
            "OrderedDistinct",
            "EagerAggregation",
            "OrderedAggregation",
            "Aggregation",
            "Apply",
            "Optional",
            "CartesianProduct",
            "NodeHashJoin",
            "NodeLeftOuterHashJoin",
            "NodeRightOuterHashJoin",
            "ValueHashJoin",
            "Unwind",
            "PartitionedUnwind",
            "Argument",
            "Union",
            "OrderedUnion",
            "Eager",
            "CacheProperties",
            "EmptyResult",
            "EmptyRow",
            "AssertSameNode",
            "AssertSameRelationship",
            "Expand(Into)",
            "OptionalExpand(Into)",
            "NullifyMetadata",
            "ProjectEndpoints",
        }
    )
    | EXISTENTIAL
)
# Leaf operators binding one node (or several, for MultiNodeIndexSeek).
NODE_SCANS = frozenset(
    {
        "AllNodesScan",
        "NodeByLabelScan",
        "UnionNodeByLabelsScan",
        "IntersectionNodeByLabelsScan",
        "SubtractionNodeByLabelsScan",
        "NodeIndexSeek",
        "NodeUniqueIndexSeek",
        "NodeIndexSeekByRange",
        "NodeUniqueIndexSeekByRange",
        "NodeIndexScan",
        "NodeIndexContainsScan",
        "NodeIndexEndsWithScan",
        "MultiNodeIndexSeek",
        "NodeByIdSeek",
        "NodeByElementIdSeek",
        "PartitionedAllNodesScan",
        "PartitionedNodeByLabelScan",
    }
)
# Operators binding a relationship and (some of) its end nodes from a pattern in Details.
PATTERN_BINDERS = frozenset(
    {
        "Expand(All)",
        "OptionalExpand(All)",
        "DirectedRelationshipTypeScan",
        "UndirectedRelationshipTypeScan",
        "DirectedAllRelationshipsScan",
        "UndirectedAllRelationshipsScan",
    }
)
# Variable-length and shortest-path operators: their inner nodes are not variables.
VAR_LENGTH = frozenset(
    {
        "VarLengthExpand(All)",
        "VarLengthExpand(Into)",
        "VarLengthExpand(Pruning)",
        "BFSPruningVarLengthExpand(All)",
        "BFSPruningVarLengthExpand(Into)",
        "ShortestPath",
        "StatefulShortestPath(All)",
        "StatefulShortestPath(Into)",
    }
)
WRITE_WORDS = ("Create", "Merge", "Delete", "Set", "Remove", "Foreach", "LoadCSV", "Transaction")

_NAME = r"(?:`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)"
_SEEK = re.compile(
    rf"^\s*(?:UNIQUE\s+|RANGE INDEX\s+|TEXT INDEX\s+|POINT INDEX\s+|INDEX\s+)?"
    rf"(?P<var>{_NAME})(?::[^\s(]*)?(?:\((?P<props>[^)]*)\))?(?:\s+WHERE\s+(?P<where>.*))?$",
    re.S,
)
_NODE_IN_PATTERN = re.compile(rf"\(\s*(?P<var>{_NAME})")
_REL_IN_PATTERN = re.compile(rf"\[\s*(?P<var>{_NAME})")
_CONJ_TEAM = re.compile(rf"^(?:(?P<var>{_NAME})\.)?team_id = \$team_id$")
_CONJ_TEAM_REV = re.compile(rf"^\$team_id = (?:(?P<var>{_NAME})\.)?team_id$")
_CONJ_VIS = re.compile(
    rf"^(?:(?P<var>{_NAME})\.)?visibility (?:IN \$visibilities|= \$visibilities\[0\])$"
)
_CACHE = re.compile(rf"cache(?:N|R)?\[(?P<inner>{_NAME}\.{_NAME})\]")
_PROC = re.compile(r"^\s*(?P<name>[A-Za-z_][\w.]*)\((?P<args>.*)\)\s*::\s*\((?P<yields>.*)\)\s*$")


class CypherRejected(Forbidden):
    """The query is not provably read-only or tenant-safe. ``reason`` is a short code."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, reason=reason, field="cypher")


@dataclass
class _Binding:
    var: str
    kind: str  # node | relationship
    operator: str
    # Scope predicates proven on the binding operator itself (an index seek's WHERE).
    own: set[str] = field(default_factory=set)


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith("`") and name.endswith("`") else name


def split_conjuncts(text: str) -> list[str]:
    """Top-level AND conjuncts of a predicate as printed in a plan, nested ``(a AND b)``
    groups flattened; ``OR``/``NOT``/``XOR`` groups stay whole (they prove nothing)."""
    out: list[str] = []
    for part in _split_top(text, " AND "):
        if part.startswith("(") and part.endswith(")") and _balanced(part[1:-1]):
            out.extend(split_conjuncts(part[1:-1]))
        else:
            out.append(part)
    return out


def _scan(text: str) -> tuple[list[int], bool]:
    """The one bracket and quote scanner: the indexes of the characters outside every quote
    and bracket (and not one themselves), and whether every bracket and quote closes without
    the depth ever going below zero."""
    top: list[int] = []
    depth, quote, closed = 0, "", True
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            closed = closed and depth >= 0
        elif depth == 0:
            top.append(i)
    return top, closed and depth == 0 and not quote


def _balanced(text: str) -> bool:
    return _scan(text)[1]


def scope_facts(predicate: str, default_var: str | None = None) -> set[tuple[str, str]]:
    """``(variable, "team"|"visibility")`` pairs proven by the predicate's conjuncts."""
    facts: set[tuple[str, str]] = set()
    for conj in split_conjuncts(_CACHE.sub(lambda m: m["inner"], predicate)):
        for pattern, what in ((_CONJ_TEAM, "team"), (_CONJ_TEAM_REV, "team"), (_CONJ_VIS, "vis")):
            m = pattern.match(conj)
            if m:
                var = _unquote(m["var"]) if m["var"] else default_var
                if var:
                    facts.add((var, what))
    return facts


def _details(op: dict[str, Any]) -> str:
    return str((op.get("args") or {}).get("Details") or "")


def _name(op: dict[str, Any]) -> str:
    return str(op.get("operatorType", "")).split("@", 1)[0]


def _ids(op: dict[str, Any]) -> set[str]:
    return {_unquote(i) for i in op.get("identifiers") or ()}


def _split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside brackets and quotes, parts stripped, empty dropped."""
    parts: list[str] = []
    start = 0
    for i in _scan(text)[0]:
        if i >= start and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _pattern_nodes(details: str) -> list[str]:
    return [_unquote(m["var"]) for m in _NODE_IN_PATTERN.finditer(details)]


def _bindings(op: dict[str, Any], child_ids: set[str]) -> list[_Binding]:
    """The node and relationship variables ``op`` binds, with scope proven on itself."""
    name, details = _name(op), _details(op)
    if name in NODE_SCANS:
        out = []
        seeks = _split_top(details) if name == "MultiNodeIndexSeek" else [details]
        for seek in seeks:
            if seek.startswith("cache"):
                continue
            m = _SEEK.match(seek)
            if not m:
                raise CypherRejected(f"cannot read the plan of {name}: {details!r}", "plan")
            var = _unquote(m["var"])
            where = m["where"] or ""
            # An index seek's WHERE names bare properties; `, cache[...]` may follow it.
            where = _split_top(where)[0] if where else ""
            own = {what for v, what in scope_facts(where, default_var=var) if v == var}
            out.append(_Binding(var, "node", name, own))
        return out
    if name in PATTERN_BINDERS or name in VAR_LENGTH:
        nodes = _pattern_nodes(details)
        rels = [_unquote(m["var"]) for m in _REL_IN_PATTERN.finditer(details)]
        if len(nodes) != 2 or len(rels) != 1:
            raise CypherRejected(f"cannot read the plan of {name}: {details!r}", "plan")
        out = [_Binding(n, "node", name) for n in nodes if n not in child_ids]
        if name in PATTERN_BINDERS:
            out.append(_Binding(rels[0], "relationship", name))
        return out
    if name in ("Expand(Into)", "OptionalExpand(Into)"):
        rels = [_unquote(m["var"]) for m in _REL_IN_PATTERN.finditer(details)]
        return [_Binding(r, "relationship", name) for r in rels if r not in child_ids]
    if name in ("ProcedureCall", "ProcedureCallEager"):
        m = _PROC.match(details)
        if not m or m["name"] not in ALLOWED_PROCEDURES:
            called = m["name"] if m else details
            raise CypherRejected(
                f"procedure {called} is not allowed; allowed: {', '.join(ALLOWED_PROCEDURES)}",
                "procedure_not_allowed",
            )
        out = []
        for item in _split_top(m["yields"]):
            var, _, typ = item.partition("::")
            typ = typ.strip().upper()
            kind = {"NODE": "node", "RELATIONSHIP": "relationship"}.get(typ)
            if kind:
                out.append(_Binding(_unquote(var.strip()), kind, name))
            elif typ.startswith(("LIST", "MAP", "PATH", "ANY")):
                raise CypherRejected(
                    f"procedure {m['name']} yields {typ}, which cannot be scope-checked",
                    "procedure_not_allowed",
                )
        return out
    return []


def _walk(op: dict[str, Any], ancestors: tuple[dict[str, Any], ...]) -> Iterator:
    yield op, ancestors
    for child in op.get("children") or ():
        yield from _walk(child, (*ancestors, op))


def check_query_type(query_type: str | None) -> None:
    if query_type != "r":
        kind = {
            "rw": "reads and writes",
            "w": "writes",
            "s": "is a schema or administration command",
        }.get(query_type or "", f"has query type {query_type!r}")
        raise CypherRejected(
            f"only read-only queries are allowed; this query {kind}", "not_read_only"
        )


def check_plan(
    plan: dict[str, Any], *, restrict_visibility: bool, database: str | None = None
) -> None:
    """Raise ``CypherRejected`` unless the plan is read-only and tenant-scoped (see module).

    Args:
        plan: the EXPLAIN plan as a dict (``operatorType``, ``args``, ``identifiers``,
            ``children``), as the neo4j driver returns it.
        restrict_visibility: the caller may not see every visibility; require
            ``visibility IN $visibilities`` on every node and relationship too.
        database: the database every operator must run in (a ``USE other`` is refused).
    """
    first: dict[str, tuple[_Binding, tuple[dict[str, Any], ...]]] = {}
    counts: dict[str, int] = {}
    needs: list[tuple[_Binding, tuple[dict[str, Any], ...]]] = []
    # Node pairs joined by a relationship pattern: one end in the team puts the other there.
    edges: list[tuple[str, str]] = []
    for op, ancestors in _walk(plan, ()):
        name = _name(op)
        where = str(op.get("operatorType", "")).partition("@")[2]
        if database and where and where != database:
            raise CypherRejected(
                f"the query reads database {where!r}; only {database!r} is served", "database"
            )
        if name == "LoadCSV" or name.startswith(WRITE_WORDS):
            raise CypherRejected(f"operator {name} is not allowed (writes or loads)", "write")
        if name.startswith(("AdministrationCommand", "SystemProcedure")):
            raise CypherRejected("administration commands are not allowed", "admin")
        if name in VAR_LENGTH and restrict_visibility:
            raise CypherRejected(
                "variable-length and shortest-path patterns are allowed only to callers who "
                "see every visibility (mode 'confidential'); use POST /graph/explain_path",
                "var_length_in_public_scope",
            )
        known = name in PASS_THROUGH or name in NODE_SCANS or name in PATTERN_BINDERS
        if not known and name not in VAR_LENGTH and not name.startswith("ProcedureCall"):
            raise CypherRejected(
                f"plan operator {name} is not supported in tenant-scoped Cypher; use a "
                "named intent or rewrite the query",
                "unsupported_operator",
            )
        child_ids: set[str] = set()
        for child in op.get("children") or ():
            child_ids |= _ids(child)
        if name in PATTERN_BINDERS or name in VAR_LENGTH or name.startswith("Expand(Into)"):
            ends = _pattern_nodes(_details(op))
            positive = not any(_name(a) in EXISTENTIAL for a in ancestors)
            if len(ends) == 2 and positive:
                edges.append((ends[0], ends[1]))
        for b in _bindings(op, child_ids):
            if b.var in first:
                # The same name in two branches of a UNION (also how the planner answers an
                # OR of two index seeks) is two bindings, each proven on its own; anywhere
                # else a second binding could borrow the first one's constraint.
                other, other_anc = first[b.var]
                if not _meet_at_union_or_join(b.var, other_anc, ancestors):
                    raise CypherRejected(
                        f"variable {b.var!r} is bound twice ({other.operator} and "
                        f"{b.operator}); use a distinct variable name for each pattern",
                        "rebound_variable",
                    )
            else:
                first[b.var] = (b, ancestors)
            counts[b.var] = counts.get(b.var, 0) + 1
            needs.append((b, ancestors))
    # A name bound to a node or relationship and later given to another value
    # (`WITH x AS y, s AS x`) would let predicates and patterns on the new value pass for the
    # old binding: refused outright.
    for op, _ in _walk(plan, ()):
        for var in first:
            if _redefines(op, var):
                raise CypherRejected(
                    f"variable {var!r} is given another value after it was bound; use a new "
                    "name instead of reusing it",
                    "rebound_variable",
                )
    proven: dict[int, set[str]] = {}
    for i, (b, ancestors) in enumerate(needs):
        facts = set(b.own)
        # Filters above the binding, while every operator between still carries the variable.
        for anc in reversed(ancestors):
            if b.var not in _ids(anc) or _redefines(anc, b.var):
                break
            if _name(anc) == "Filter":
                facts |= {what for v, what in scope_facts(_details(anc)) if v == b.var}
        proven[i] = facts
    # A name is in the team when every binding of it is proven; a name bound once is also in
    # the team when a relationship pattern joins it to a name in the team.
    in_team = {
        v
        for v in counts
        if all("team" in proven[i] for i, (b, _) in enumerate(needs) if b.var == v)
    }
    changed = True
    while changed:
        changed = False
        for a, c in edges:
            for x, y in ((a, c), (c, a)):
                if x in in_team and y not in in_team and counts.get(y, 0) <= 1:
                    in_team.add(y)
                    changed = True
    for i, (b, _) in enumerate(needs):
        missing = []
        if b.kind == "node" and b.var not in in_team:
            missing.append(f"{b.var}.team_id = $team_id")
        if restrict_visibility and "vis" not in proven[i]:
            missing.append(f"{b.var}.visibility IN $visibilities")
        if missing:
            raise CypherRejected(
                f"{b.kind} variable {b.var!r} is not constrained to your scope: add "
                f"WHERE {' AND '.join(missing)} (name anonymous nodes and relationships so "
                "they can be constrained)",
                "unscoped_variable",
            )


_AS = re.compile(rf"^(?P<expr>.+?)\s+AS\s+(?P<name>{_NAME})$", re.S)


def _redefines(op: dict[str, Any], var: str) -> bool:
    """Whether ``op`` (a projection, aggregation or unwind) gives the name ``var`` to
    something else (``WITH x AS y, s AS x``): filters above it then test the new value."""
    if _name(op) in ("Filter", "ProduceResults"):
        return False
    for item in _split_top(_details(op)):
        m = _AS.match(item)
        if m and _unquote(m["name"]) == var and _unquote(m["expr"].strip()) != var:
            return True
    return False


def _meet_at_union_or_join(
    var: str, a: tuple[dict[str, Any], ...], b: tuple[dict[str, Any], ...]
) -> bool:
    """Whether two bindings of ``var`` meet at a UNION, or at a hash join on ``var`` (which
    keeps only rows where both are the same node)."""
    common = None
    for x, y in zip(a, b, strict=False):
        if x is not y:
            break
        common = x
    if common is None:
        return False
    name = _name(common)
    if name in ("Union", "OrderedUnion"):
        return True
    if name in ("NodeHashJoin", "NodeLeftOuterHashJoin", "NodeRightOuterHashJoin"):
        return var in {_unquote(k) for k in _split_top(_details(common))}
    return False
