"""Proof that a caller's Cypher is read-only and stays inside one tenant's scope.

The gateway never runs caller Cypher blind. Before it runs, ``EXPLAIN`` gives the query type
and the plan, and ``check_plan`` proves on that plan (see docs/graph_schema.md, "Raw Cypher"):

1. **Read-only**: the query type is ``r`` and no operator writes, loads files (``LoadCSV``) or
   calls a procedure outside ``ALLOWED_PROCEDURES``.
2. **Tenant scope**: every node variable the plan binds (a scan, a seek, an expansion, a
   procedure yield) is constrained by the conjunct ``v.team_id = $team_id`` — in its own index
   seek, in the predicate an expansion prints (an ``OptionalExpand``'s, for what it binds),
   or in a ``Filter`` above it whose rows still carry it — and is bound only once, so that
   constraint cannot belong to a different binding of the same name. A second binding is
   the same node only at a hash join on the name (the planner matching a bound variable
   again), where what the other side proves holds for the rows kept; an outer join's
   preserved side proves itself. Nodes reached along relationships are then in the team too:
   the gateway only writes relationships whose two ends are in one team
   (docs/graph_schema.md); inside an optional part (OPTIONAL MATCH) only from the names bound
   before it to the ones it binds, since rows it does not match come out anyway.
3. **Visibility**, when the caller may not see every visibility: the same, with
   ``v.visibility IN $visibilities`` for every node *and* relationship variable; variable
   length patterns (whose inner nodes cannot be constrained this way) are refused then.

``$team_id`` and ``$visibilities`` are set by the gateway from the AccessContext, never by the
caller. ``deployments.graph_store.scope.scope_query`` writes those predicates into a simple
query that names none (the result is proven the same way before it runs). Operators the checker
does not know are refused: an unknown shape is never assumed safe. Each returned node,
relationship and path is filtered again after the run (``serve_app/access/graph.py``,
``may_see_value``), as a second line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from deployments.errors import Forbidden
from deployments.protocols import NO_POLICY

# Set by the gateway from the caller's scope (GraphScope.params); a caller may not name them.
RESERVED_PARAMS = ("team_id", "visibilities", "acl_principals", *NO_POLICY)

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


@dataclass
class _Need:
    """A binding and the operators from the plan's root down to the one that binds it."""

    binding: _Binding
    chain: tuple[dict[str, Any], ...]

    @property
    def ancestors(self) -> tuple[dict[str, Any], ...]:
        return self.chain[:-1]

    def under(self, op: dict[str, Any]) -> bool:
        return any(x is op for x in self.chain)

    def carried(self) -> Iterator[dict[str, Any]]:
        """The ancestors, nearest first, while each still carries the variable unchanged."""
        var = self.binding.var
        for anc in reversed(self.ancestors):
            if var not in _ids(anc) or _redefines(anc, var):
                return
            yield anc

    def reaches(self, op: dict[str, Any]) -> bool:
        return any(anc is op for anc in self.carried())

    def facts(self, below: dict[str, Any] | None = None) -> set[str]:
        """Scope proven on the binding itself and by the Filters above it (those below
        ``below`` only, when given)."""
        facts = set(self.binding.own)
        for anc in self.carried():
            if anc is below:
                break
            if _name(anc) == "Filter":
                facts |= {w for v, w in scope_facts(_details(anc)) if v == self.binding.var}
        return facts


# Node hash joins and the sides (child index) whose rows are kept only when the other side
# has the same node: both for an inner join, the optional side for an outer one (Neo4j's
# left outer join keeps every row of its first child, the right outer join of its second).
_HASH_JOINS = {
    "NodeHashJoin": (0, 1),
    "NodeLeftOuterHashJoin": (1,),
    "NodeRightOuterHashJoin": (0,),
}


def _optional_parts(
    op: dict[str, Any], ancestors: tuple[dict[str, Any], ...]
) -> list[tuple[str, dict[str, Any]]]:
    """The optional parts of the plan that hold ``op``: ``("op", op)`` when it is an
    OptionalExpand (what it binds itself), and ``("tree", child)`` for the input of each
    ``Optional`` above it and the optional side of each outer hash join above it (what is
    bound in that subtree). A row the part did not match still comes out, with the names
    bound outside the part and nulls for the rest."""
    parts = [("op", op)] if _name(op).startswith("OptionalExpand") else []
    chain = (*ancestors, op)
    for depth, anc in enumerate(ancestors):
        below = chain[depth + 1]
        if _name(anc) == "Optional":
            parts.append(("tree", below))
        sides = _HASH_JOINS.get(_name(anc), (0, 1))
        children = anc.get("children") or []
        if len(sides) == 1 and len(children) == 2 and children[sides[0]] is below:
            parts.append(("tree", below))
    return parts


def _join_keys(op: dict[str, Any]) -> set[str]:
    if _name(op) not in _HASH_JOINS:
        return set()
    return {_unquote(k) for k in _split_top(_details(op))}


def _covering_joins(need: _Need) -> Iterator[tuple[int, dict[str, Any], dict[str, Any]]]:
    """``(depth, join, other side)`` of each hash join on the binding's name that keeps the
    binding's rows only where the other side has the same node, nearest first."""
    var, chain = need.binding.var, need.chain
    depth = len(chain) - 1
    for join in need.carried():
        depth -= 1
        children = join.get("children") or []
        if var not in _join_keys(join) or len(children) != 2:
            continue
        side = next((n for n, c in enumerate(children) if c is chain[depth + 1]), None)
        if side in _HASH_JOINS[_name(join)]:
            yield depth, join, children[1 - side]


def _joined_facts(
    need: _Need, needs: list[_Need], same: list[int], base: list[set[str]]
) -> set[str]:
    """What the other side of each covering hash join proves of the name: the bindings of
    it there, up to the join (all of them), or, where the name comes into that side as an
    argument, every binding of it outside the join (all of them)."""
    out: set[str] = set()
    for _, join, other in _covering_joins(need):
        there = [n for n in same if needs[n].under(other)]
        if there:
            reaching = [n for n in there if needs[n].reaches(join)]
            if reaching:
                out |= set.intersection(*(needs[n].facts(below=join) for n in reaching))
            continue
        outside = [n for n in same if not needs[n].under(join)]
        if outside:
            out |= set.intersection(*(base[n] for n in outside))
    return out


def _same_node(var: str, a: _Need, b: _Need, needs: list[_Need], same: list[int]) -> bool:
    """Whether two bindings of ``var`` can only be one node in the rows that go on (see
    ``_meet_at_union_or_join``), or one of them is joined, below where the two meet, to the
    name coming in as an argument: the planner matched the bound variable again."""
    if _meet_at_union_or_join(var, a.ancestors, b.ancestors):
        return True
    if _confined(var, a) and _confined(var, b):
        return True
    common = 0
    for x, y in zip(a.ancestors, b.ancestors, strict=False):
        if x is not y:
            break
        common += 1
    for need in (a, b):
        for depth, _, other in _covering_joins(need):
            if depth >= common and not any(needs[n].under(other) for n in same):
                return True
    return False


def _confined(var: str, need: _Need) -> bool:
    """Whether a binding lives only inside an existential subquery (``EXISTS { ... }``: the
    name never comes out of its semi-apply), where it is proven on its own and no other
    binding can borrow its constraint. The planner may plan one subquery twice (both sides
    of a hash join), which is not a second name."""
    return any(_name(anc) in EXISTENTIAL and var not in _ids(anc) for anc in need.ancestors)


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


def _pattern_and_where(details: str) -> tuple[str, str]:
    """An expansion's Details split into its pattern and the predicate after a top-level
    ``WHERE`` (``OptionalExpand`` prints the OPTIONAL MATCH's predicates there); ``""`` when
    there is none or the text is not one pattern and one predicate."""
    parts = _split_top(details, " WHERE ")
    if len(parts) == 2:
        return parts[0], parts[1]
    return (parts[0] if parts else details), ""


def _pattern_nodes(details: str) -> list[str]:
    pattern, _ = _pattern_and_where(details)
    return [_unquote(m["var"]) for m in _NODE_IN_PATTERN.finditer(pattern)]


def _pattern_rels(details: str) -> list[str]:
    pattern, _ = _pattern_and_where(details)
    return [_unquote(m["var"]) for m in _REL_IN_PATTERN.finditer(pattern)]


def _own_facts(where: str, var: str) -> set[str]:
    return {what for v, what in scope_facts(where, default_var=None) if v == var}


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
        rels = _pattern_rels(details)
        if len(nodes) != 2 or len(rels) != 1:
            raise CypherRejected(f"cannot read the plan of {name}: {details!r}", "plan")
        # The predicate printed with an expansion holds for every variable it binds: rows
        # failing it are dropped (an OptionalExpand binds null instead, which is no node).
        # Variable-length ones print predicates of the nodes and relationships inside.
        where = _pattern_and_where(details)[1] if name in PATTERN_BINDERS else ""
        out = [_Binding(n, "node", name, _own_facts(where, n)) for n in nodes if n not in child_ids]
        if name in PATTERN_BINDERS:
            out.append(_Binding(rels[0], "relationship", name, _own_facts(where, rels[0])))
        return out
    if name in ("Expand(Into)", "OptionalExpand(Into)"):
        _, where = _pattern_and_where(details)
        return [
            _Binding(r, "relationship", name, _own_facts(where, r))
            for r in _pattern_rels(details)
            if r not in child_ids
        ]
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
    needs, edges = _bindings_and_edges(plan, restrict_visibility, database)
    by_var: dict[str, list[int]] = {}
    for i, need in enumerate(needs):
        by_var.setdefault(need.binding.var, []).append(i)
    _check_bound_once(needs, by_var)
    _check_not_redefined(plan, by_var)
    proven = _proven_facts(needs, by_var)
    in_team = _names_in_team(needs, by_var, proven, edges)
    _check_scoped(needs, proven, in_team, restrict_visibility)


# A relationship pattern's two end names and the optional parts that hold the pattern.
_Edge = tuple[str, str, list[tuple[str, dict[str, Any]]]]


def _bindings_and_edges(
    plan: dict[str, Any], restrict_visibility: bool, database: str | None
) -> tuple[list[_Need], list[_Edge]]:
    """Every operator checked on its own (allowed, in the database served), and what the
    plan binds: each node or relationship binding with the operators above it, and the node
    pairs joined by a relationship pattern (one end in the team puts the other there, with
    the optional parts that hold the pattern)."""
    needs: list[_Need] = []
    edges: list[_Edge] = []
    for op, ancestors in _walk(plan, ()):
        name = _name(op)
        _check_operator(op, name, restrict_visibility, database)
        child_ids: set[str] = set()
        for child in op.get("children") or ():
            child_ids |= _ids(child)
        if name in PATTERN_BINDERS or name in VAR_LENGTH or name.startswith("Expand(Into)"):
            ends = _pattern_nodes(_details(op))
            positive = not any(_name(a) in EXISTENTIAL for a in ancestors)
            if len(ends) == 2 and positive:
                edges.append((ends[0], ends[1], _optional_parts(op, ancestors)))
        for b in _bindings(op, child_ids):
            needs.append(_Need(b, (*ancestors, op)))
    return needs, edges


def _check_operator(
    op: dict[str, Any], name: str, restrict_visibility: bool, database: str | None
) -> None:
    """One operator: in the database served, no write, load or administration, no
    variable-length pattern for a caller who may not see every visibility, and one whose
    scoping this module knows."""
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


def _check_bound_once(needs: list[_Need], by_var: dict[str, list[int]]) -> None:
    for var, idx in by_var.items():
        first = needs[idx[0]]
        for j in idx[1:]:
            # The same name in two branches of a UNION (also how the planner answers an OR
            # of two index seeks) is two bindings, each proven on its own; at a hash join on
            # the name (directly, or with the name an argument from outside the join) the
            # planner matches a bound variable again and keeps only rows where both are the
            # same node. Anywhere else a second binding could borrow the first one's
            # constraint.
            if not _same_node(var, first, needs[j], needs, idx):
                raise CypherRejected(
                    f"variable {var!r} is bound twice ({first.binding.operator} and "
                    f"{needs[j].binding.operator}); use a distinct variable name for each "
                    "pattern",
                    "rebound_variable",
                )


def _check_not_redefined(plan: dict[str, Any], by_var: dict[str, list[int]]) -> None:
    """A name bound to a node or relationship and later given to another value
    (`WITH x AS y, s AS x`) would let predicates and patterns on the new value pass for the
    old binding: refused outright."""
    for op, _ in _walk(plan, ()):
        for var in by_var:
            if _redefines(op, var):
                raise CypherRejected(
                    f"variable {var!r} is given another value after it was bound; use a new "
                    "name instead of reusing it",
                    "rebound_variable",
                )


def _proven_facts(needs: list[_Need], by_var: dict[str, list[int]]) -> dict[int, set[str]]:
    """Per binding, what the filters above it prove while every operator between still
    carries the variable; at a hash join on the name, the rows kept on a side the join does
    not preserve hold the node of the other side: what is proven there holds here too."""
    base = [need.facts() for need in needs]
    proven = {i: set(base[i]) for i in range(len(needs))}
    for i, need in enumerate(needs):
        proven[i] |= _joined_facts(need, needs, by_var[need.binding.var], base)
    return proven


def _names_in_team(
    needs: list[_Need],
    by_var: dict[str, list[int]],
    proven: dict[int, set[str]],
    edges: list[_Edge],
) -> set[str]:
    """A name is in the team when every binding of it is proven; a name bound once is also
    in the team when a relationship pattern joins it to a name in the team."""
    in_team = {v for v, idx in by_var.items() if all("team" in proven[i] for i in idx)}
    counts = {var: len(idx) for var, idx in by_var.items()}

    # Inside an optional part a row keeps the names bound before it when the pattern is not
    # there: the team goes from those names to the ones the part binds, never back.
    def binds_within(var: str, part: tuple[str, dict[str, Any]]) -> bool:
        kind, where = part
        if kind == "op":
            return any(needs[n].chain[-1] is where for n in by_var.get(var, ()))
        return any(needs[n].under(where) for n in by_var.get(var, ()))

    changed = True
    while changed:
        changed = False
        for a, c, parts in edges:
            for x, y in ((a, c), (c, a)):
                if (
                    x in in_team
                    and y not in in_team
                    and counts.get(y, 0) <= 1
                    and all(binds_within(y, part) for part in parts)
                ):
                    in_team.add(y)
                    changed = True
    return in_team


def _check_scoped(
    needs: list[_Need],
    proven: dict[int, set[str]],
    in_team: set[str],
    restrict_visibility: bool,
) -> None:
    for i, need in enumerate(needs):
        b = need.binding
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
