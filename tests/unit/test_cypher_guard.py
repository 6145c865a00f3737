"""The plan reader of deployments/cypher_guard.py on plans shaped like Neo4j 5.26's EXPLAIN
output (the same checks run on real plans in tests/integration/test_graph_queries.py)."""

from __future__ import annotations

import pytest

from deployments.cypher_guard import (
    CypherRejected,
    check_plan,
    check_query_type,
    scope_facts,
    split_conjuncts,
)


def op(kind: str, details: str | None, ids: list[str], *children: dict) -> dict:
    return {
        "operatorType": f"{kind}@neo4j",
        "args": {"Details": details} if details is not None else {},
        "identifiers": ids,
        "children": list(children),
    }


def test_conjuncts_flatten_and_groups_but_keep_or_whole():
    text = "(r.name = $name AND p.team_id = $team_id) AND (p:Project OR true) AND NOT x = y"
    assert split_conjuncts(text) == [
        "r.name = $name",
        "p.team_id = $team_id",
        "p:Project OR true",
        "NOT x = y",
    ]
    assert split_conjuncts("a.s = 'x AND y' AND b.t = 1") == ["a.s = 'x AND y'", "b.t = 1"]


def test_scope_facts_read_team_and_visibility_predicates():
    facts = scope_facts(
        "cache[p.team_id] = $team_id AND $team_id = q.team_id AND p.visibility IN $visibilities "
        "AND r.visibility = $visibilities[0] AND (s.team_id = $team_id OR true)"
    )
    assert facts == {("p", "team"), ("q", "team"), ("p", "vis"), ("r", "vis")}
    assert scope_facts("team_id = $team_id AND id = $x", default_var="n") == {("n", "team")}


SCAN = op("NodeByLabelScan", "n:Doc", ["n"])


def test_a_filtered_scan_passes_and_an_unfiltered_one_names_the_fix():
    check_plan(
        op("ProduceResults", "n", ["n"], op("Filter", "n.team_id = $team_id", ["n"], SCAN)),
        restrict_visibility=False,
    )
    with pytest.raises(CypherRejected) as err:
        check_plan(op("ProduceResults", "n", ["n"], SCAN), restrict_visibility=False)
    assert err.value.reason == "unscoped_variable"
    assert "n.team_id = $team_id" in err.value.message


def test_expansion_from_a_team_node_stays_in_the_team_but_needs_visibility_in_public():
    plan = op(
        "ProduceResults",
        "m",
        ["n", "r", "m"],
        op(
            "Expand(All)",
            "(n)-[r:LINKS_TO]->(m)",
            ["n", "r", "m"],
            op("Filter", "n.team_id = $team_id AND n.visibility IN $visibilities", ["n"], SCAN),
        ),
    )
    check_plan(plan, restrict_visibility=False)
    with pytest.raises(CypherRejected) as err:
        check_plan(plan, restrict_visibility=True)
    assert "'r'" in err.value.message or "'m'" in err.value.message


def test_unknown_operators_writes_and_procedures_are_refused():
    for kind, details, reason in (
        ("SomethingNew", None, "unsupported_operator"),
        ("Create", "(n:X)", "write"),
        ("LoadCSV", "line", "write"),
        ("ProcedureCall", "db.labels() :: (label :: STRING)", "procedure_not_allowed"),
    ):
        with pytest.raises(CypherRejected) as err:
            check_plan(
                op("ProduceResults", "x", ["x"], op(kind, details, ["x"])),
                restrict_visibility=False,
            )
        assert err.value.reason == reason


def test_query_type_must_be_read():
    check_query_type("r")
    for kind in ("rw", "w", "s", None):
        with pytest.raises(CypherRejected):
            check_query_type(kind)


def test_renaming_a_scoped_node_onto_an_unscoped_one_is_refused():
    # MATCH (s:Doc) WHERE s.team_id = $team_id MATCH (x) WITH x AS y, s AS x
    # WHERE x.team_id = $team_id RETURN y.title
    plan = op(
        "ProduceResults",
        "`y.title`",
        ["y", "`y.title`", "s", "x"],
        op(
            "Filter",
            "cache[x.team_id] = $team_id",
            ["s", "x", "y"],
            op(
                "Projection",
                "x AS y, s AS x",
                ["s", "x", "y"],
                op(
                    "CartesianProduct",
                    None,
                    ["s", "x"],
                    op(
                        "Filter",
                        "s.team_id = $team_id",
                        ["s"],
                        op("NodeByLabelScan", "s:Doc", ["s"]),
                    ),
                    op("AllNodesScan", "x", ["x"]),
                ),
            ),
        ),
    )
    with pytest.raises(CypherRejected) as err:
        check_plan(plan, restrict_visibility=False)
    assert err.value.reason == "rebound_variable"
