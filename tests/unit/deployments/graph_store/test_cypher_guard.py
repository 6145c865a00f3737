"""The plan reader of deployments/graph_store/guard.py on plans shaped like Neo4j 5.26's EXPLAIN
output (the same checks run on real plans in tests/integration/test_graph_queries.py)."""

from __future__ import annotations

import pytest

from deployments.graph_store.guard import (
    CypherRejected,
    check_plan,
    check_query_type,
    scope_facts,
    split_conjuncts,
)
from deployments.graph_store.scope import scope_query


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


def team_scan(var: str, label: str, vis: bool = False) -> dict:
    predicate = f"{var}.team_id = $team_id" + (
        f" AND {var}.visibility IN $visibilities" if vis else ""
    )
    return op("Filter", predicate, [var], op("NodeByLabelScan", f"{var}:{label}", [var]))


def test_optional_expand_predicates_scope_the_variables_it_binds():
    # MATCH (a:Project {team_id: $team_id}) WHERE a.visibility IN $visibilities
    # OPTIONAL MATCH (a)-[u:USES]-(r:Resource) WHERE r.team_id = $team_id
    #   AND r.visibility IN $visibilities AND u.visibility IN $visibilities RETURN a, r
    plan = op(
        "ProduceResults",
        "a, r",
        ["a", "u", "r"],
        op(
            "OptionalExpand(All)",
            "(a)-[u:USES]-(r) WHERE r:Resource AND r.team_id = $team_id "
            "AND r.visibility = $visibilities[0] AND u.visibility = $visibilities[0]",
            ["a", "u", "r"],
            op(
                "NodeIndexSeek",
                "RANGE INDEX a:Project(team_id, visibility) WHERE team_id = $team_id AND "
                "visibility = $visibilities[0], cache[a.team_id], cache[a.visibility]",
                ["a"],
            ),
        ),
    )
    check_plan(plan, restrict_visibility=True)
    # A function call in the predicate is no third node of the pattern.
    plan["children"][0]["args"]["Details"] += " AND NOT r.name = toLower(a.name)"
    check_plan(plan, restrict_visibility=True)


def test_optional_expand_predicates_prove_nothing_of_the_bound_end():
    # MATCH (a) OPTIONAL MATCH (a)-[u]-(r) WHERE a.team_id = $team_id AND r.team_id = ...:
    # a row whose a fails the predicate stays, with r null.
    plan = op(
        "ProduceResults",
        "a, r",
        ["a", "u", "r"],
        op(
            "OptionalExpand(All)",
            "(a)-[u]-(r) WHERE a.team_id = $team_id AND r.team_id = $team_id",
            ["a", "u", "r"],
            op("AllNodesScan", "a", ["a"]),
        ),
    )
    with pytest.raises(CypherRejected) as err:
        check_plan(plan, restrict_visibility=False)
    assert err.value.reason == "unscoped_variable" and "'a'" in err.value.message


def outer_join(kind: str, preserved: dict, optional: dict) -> dict:
    children = [preserved, optional] if kind.startswith("NodeLeft") else [optional, preserved]
    return op("ProduceResults", "a, t", ["a", "t", "m"], op(kind, "a", ["a", "t", "m"], *children))


def optional_side() -> dict:
    return op(
        "Filter",
        "m.visibility IN $visibilities",
        ["t", "m", "a"],
        op("Expand(All)", "(t)-[m:MENTIONS]-(a)", ["t", "m", "a"], team_scan("t", "Topic", True)),
    )


@pytest.mark.parametrize("kind", ["NodeLeftOuterHashJoin", "NodeRightOuterHashJoin"])
def test_optional_match_planned_as_an_outer_hash_join_on_the_bound_node(kind):
    # MATCH (a:Doc {team_id: $team_id}) WHERE a.visibility IN $visibilities
    # OPTIONAL MATCH (a)-[m:MENTIONS]-(t:Topic) USING JOIN ON a WHERE t.team_id = $team_id
    #   AND t.visibility IN $visibilities AND m.visibility IN $visibilities RETURN a, t
    # (the plan shape of Neo4j 5.26: the join side named by the operator keeps every row).
    check_plan(
        outer_join(kind, team_scan("a", "Doc", True), optional_side()), restrict_visibility=True
    )


@pytest.mark.parametrize("kind", ["NodeLeftOuterHashJoin", "NodeRightOuterHashJoin"])
def test_outer_join_does_not_scope_the_kept_side_by_the_optional_one(kind):
    # MATCH (a:Doc) OPTIONAL MATCH (a)-[m]-(t) USING JOIN ON a WHERE a.team_id = $team_id ...:
    # every a of the preserved side comes out, matched or not.
    optional = op(
        "Filter",
        "a.team_id = $team_id AND a.visibility IN $visibilities",
        ["t", "m", "a"],
        optional_side(),
    )
    plan = outer_join(kind, op("NodeByLabelScan", "a:Doc", ["a"]), optional)
    for restrict in (False, True):
        with pytest.raises(CypherRejected) as err:
            check_plan(plan, restrict_visibility=restrict)
        assert err.value.reason == "unscoped_variable" and "'a'" in err.value.message


def apply_with_join_on_argument(rhs_a: dict) -> dict:
    """MATCH (a:Project) WHERE a.team_id = $team_id OPTIONAL MATCH (a)-[u:USES]-(r:Resource)
    WHERE r.team_id = $team_id, the optional part planned as a hash join of the argument ``a``
    with an expansion from ``r`` (which binds ``a`` again)."""
    expand = op("Expand(All)", "(r)-[u:USES]-(a)", ["r", "u", "a"], team_scan("r", "Resource"))
    return op(
        "ProduceResults",
        "a, r",
        ["a", "u", "r"],
        op(
            "Apply",
            None,
            ["a", "u", "r"],
            team_scan("a", "Project"),
            op(
                "Optional",
                "a",
                ["a", "u", "r"],
                op("NodeHashJoin", "a", ["a", "u", "r"], rhs_a, expand),
            ),
        ),
    )


def test_a_bound_node_matched_again_through_a_join_on_the_argument_is_one_node():
    check_plan(apply_with_join_on_argument(op("Argument", "a", ["a"])), restrict_visibility=False)


def test_a_new_node_joined_under_an_old_name_is_still_bound_twice():
    # The join's other side binds `a` itself (a scan), not the argument: a second `a`.
    plan = apply_with_join_on_argument(op("AllNodesScan", "a", ["a"]))
    with pytest.raises(CypherRejected) as err:
        check_plan(plan, restrict_visibility=False)
    assert err.value.reason == "rebound_variable"


def test_hash_join_of_an_unscoped_expansion_with_a_scoped_scan():
    # MATCH (a:Project) WHERE a.team_id = $team_id MATCH (a)-[:USES]-(b:Resource)
    # USING JOIN ON a WHERE b.team_id = $team_id RETURN b
    plan = op(
        "ProduceResults",
        "b",
        ["b", "anon_0", "a"],
        op(
            "NodeHashJoin",
            "a",
            ["b", "anon_0", "a"],
            op(
                "Expand(All)",
                "(b)-[anon_0:USES]-(a)",
                ["b", "anon_0", "a"],
                team_scan("b", "Resource"),
            ),
            team_scan("a", "Project"),
        ),
    )
    check_plan(plan, restrict_visibility=False)


def test_an_optional_part_in_the_team_does_not_put_the_rows_before_it_there():
    # MATCH (a:Project) WITH a LIMIT 100 OPTIONAL MATCH (a)-[:USES]-(r:Resource)-[:USES]-(b)
    # WHERE r.team_id = $team_id AND b.team_id = $team_id RETURN a.id: every project of every
    # team comes out (with r and b null), so r in the team says nothing of a.
    plan = op(
        "ProduceResults",
        "a",
        ["a", "b", "r", "x", "y"],
        op(
            "Apply",
            None,
            ["a", "b", "r", "x", "y"],
            op("Limit", "100", ["a"], op("NodeByLabelScan", "a:Project", ["a"])),
            op(
                "Optional",
                "a",
                ["a", "b", "r", "x", "y"],
                op(
                    "Filter",
                    "b.team_id = $team_id",
                    ["a", "b", "r", "x", "y"],
                    op(
                        "Expand(All)",
                        "(r)-[y:USES]-(b)",
                        ["a", "b", "r", "x", "y"],
                        op(
                            "Filter",
                            "r.team_id = $team_id",
                            ["a", "x", "r"],
                            op(
                                "Expand(All)",
                                "(a)-[x:USES]-(r)",
                                ["a", "x", "r"],
                                op("Argument", "a", ["a"]),
                            ),
                        ),
                    ),
                ),
            ),
        ),
    )
    with pytest.raises(CypherRejected) as err:
        check_plan(plan, restrict_visibility=False)
    assert err.value.reason == "unscoped_variable" and "'a'" in err.value.message
    # With `a` in the team, the optional part's unfiltered ends are reached from it.
    plan["children"][0]["children"][0]["children"][0] = team_scan("a", "Project")
    plan["children"][0]["children"][1]["children"][0]["args"]["Details"] = "true"
    plan["children"][0]["children"][1]["children"][0]["children"][0]["children"][0]["args"][
        "Details"
    ] = "true"
    check_plan(plan, restrict_visibility=False)


SPEC = "MATCH (p:Project)-[:USES]->(r:Resource {name:$name}) RETURN p LIMIT 10"


def test_the_gateway_compiles_the_scope_into_a_simple_query():
    assert scope_query(SPEC, restrict_visibility=False) == (
        "MATCH (p:Project)-[:USES]->(r:Resource {name:$name}) "
        "WHERE p.team_id = $team_id AND r.team_id = $team_id RETURN p LIMIT 10"
    )
    # Public scope: the visibility bound too, for the relationship as well (named for it).
    assert scope_query(SPEC, restrict_visibility=True) == (
        "MATCH (p:Project)-[_g0:USES]->(r:Resource {name:$name}) "
        "WHERE p.team_id = $team_id AND p.visibility IN $visibilities "
        "AND _g0.visibility IN $visibilities "
        "AND r.team_id = $team_id AND r.visibility IN $visibilities RETURN p LIMIT 10"
    )


def test_scoping_names_anonymous_nodes_and_keeps_the_callers_predicate_whole():
    query = (
        "match (a:Project) where a.id = 'x' OR true "
        "optional match (a)--(:Resource)<-[u]-(b) WHERE b.name STARTS WITH 'm' "
        "RETURN a.id, b ORDER BY a.id SKIP 1 LIMIT 5"
    )
    assert scope_query(query, restrict_visibility=False) == (
        "MATCH (a:Project) WHERE a.team_id = $team_id AND (a.id = 'x' OR true) "
        "OPTIONAL MATCH (a)--(_g0:Resource)<-[u]-(b) "
        "WHERE _g0.team_id = $team_id AND b.team_id = $team_id AND (b.name STARTS WITH 'm') "
        "RETURN a.id, b ORDER BY a.id SKIP 1 LIMIT 5"
    )
    # A name the query uses already is not taken; a bound name referenced again gets nothing.
    assert scope_query(
        "MATCH (_g0)-->() MATCH (_g0)-->(x) RETURN x", restrict_visibility=False
    ) == (
        "MATCH (_g0)-->(_g1) WHERE _g0.team_id = $team_id AND _g1.team_id = $team_id "
        "MATCH (_g0)-->(x) WHERE x.team_id = $team_id RETURN x"
    )


@pytest.mark.parametrize(
    "query",
    [
        "MATCH (a) WITH a RETURN a",
        "MATCH (a) RETURN a UNION MATCH (b) RETURN b",
        "MATCH (a) CALL () { MATCH (x) RETURN x } RETURN a, x",
        "MATCH (a)-[*1..3]->(b) RETURN b",
        "MATCH p = shortestPath((a)-[*]-(b)) RETURN p",
        "MATCH ((a)-->(b)){1,3} RETURN a",
        "MATCH (a WHERE a.x = 1) RETURN a",
        "MATCH (a) USING INDEX a:Doc(id) RETURN a",
        "MATCH (a) RETURN *",
        "MATCH (n) RETURN n // WHERE n.team_id = $team_id",
        "MATCH (n) /* WHERE n.team_id = $team_id */ RETURN n",
        "UNWIND [1] AS x MATCH (n) RETURN n",
        "MATCH (n) RETURN n.id AS id ORDER BY id UNION ALL MATCH (m) RETURN m.id AS id",
        "MATCH (n) SET n.x = 1 RETURN n",
        "MATCH (n) RETURN n WITH n RETURN n",
        "CALL db.labels() YIELD label RETURN label",
        "MATCH (n {name: 'unclosed) RETURN n",
        "MATCH (n)",
    ],
)
def test_what_the_gateway_does_not_scope_itself(query):
    for restrict in (False, True):
        assert scope_query(query, restrict_visibility=restrict) is None


def exists_check(outer: str, inner: str) -> dict:
    """``WHERE EXISTS { MATCH (outer)-[via]-(inner) WHERE inner.team_id = $team_id }`` as
    the planner prints it: a semi-apply whose right side binds ``inner`` from the argument."""
    return op(
        "SelectOrSemiApply",
        f"NOT coalesce({outer}.derived, false)",
        [outer],
        team_scan(outer, "Topic"),
        op(
            "Filter",
            f"{inner}.team_id = $team_id",
            [outer, "via", inner],
            op(
                "Expand(All)",
                f"({outer})-[via]-({inner})",
                [outer, "via", inner],
                op("Argument", outer, [outer]),
            ),
        ),
    )


def test_a_subquery_planned_twice_binds_its_name_twice_without_rebinding():
    # One EXISTS on a join node, planned on both sides of the hash join (RELATED_PROJECTS).
    plan = op(
        "ProduceResults",
        "r",
        ["r"],
        op("NodeHashJoin", "r", ["r"], exists_check("r", "src"), exists_check("r", "src")),
    )
    check_plan(plan, restrict_visibility=False)


def test_a_name_bound_inside_a_subquery_and_outside_is_still_a_rebinding():
    plan = op(
        "ProduceResults",
        "src",
        ["r", "src"],
        op(
            "CartesianProduct",
            None,
            ["r", "src"],
            exists_check("r", "src"),
            op("AllNodesScan", "src", ["src"]),
        ),
    )
    with pytest.raises(CypherRejected) as err:
        check_plan(plan, restrict_visibility=False)
    assert err.value.reason in ("rebound_variable", "unscoped_variable")
