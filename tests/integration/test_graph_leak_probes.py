"""The leak probes of the graph endpoints (tests/security/leak_probes.py --graph) against the real
Neo4j: no leak, no write and no 500 (but the known one below), and a broken graph access path
is reported as a leak (a detector that cannot fail is worthless)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from deployments.protocols import GraphScope
from serve_app.access import graph as graph_access
from tests.security.leak_probes import GRAPH_ENDPOINTS, render_tables, run_probes

pytestmark = pytest.mark.integration


def test_graph_probes_find_no_leak(settings):
    result = run_probes(300, seed=5, graph=True, neo4j=settings.neo4j)
    assert result["leaks_found"] == 0, result["leaks"]
    assert not result["server_error_samples"], result["server_error_samples"]
    # Every graph endpoint was probed, and enough answers came back to check.
    assert set(GRAPH_ENDPOINTS) <= set(result["runs"])
    assert result["statuses"][GRAPH_ENDPOINTS[0]].get("200", 0) > 10
    assert result["statuses"][GRAPH_ENDPOINTS[4]].get("200", 0) > 0
    # Writes were refused or confined to the run's teams, and the run left nothing behind.
    checks = result["graph_checks"]
    assert checks["changed_outside_upserts"] == 0 and checks["sentinels"] == 0, checks
    assert checks["left_after_clean_up"] == 0
    assert "| **POST /graph/query intent total** |" in render_tables(result)


def test_a_failing_fulltext_procedure_is_not_a_500(settings):
    from serve_app.testing import TENANCY_POLICY, claims, jwt_auth, mint
    from tests.security.graph_gateway import GraphGateway

    gw = GraphGateway(jwt_auth(), TENANCY_POLICY, settings.neo4j)
    try:
        # Every group and permission of the policy: Cypher is not refused by it.
        token = mint(
            claims(
                sub="alice",
                teams={"dao_x_probe": ["owner"]},
                groups=["ops", "board"],
                permissions=["skill:read"],
            )
        )
        response = gw.post(
            "/graph/query",
            {
                "team_id": "dao_x_probe",
                "mode": "confidential",
                "cypher": "CALL db.index.fulltext.queryNodes('entity_names', $q) YIELD node "
                "WHERE node.team_id = $team_id RETURN node LIMIT 5",
                "params": {"q": "((("},
            },
            {"authorization": f"Bearer {token}"},
        )
    finally:
        gw.close()
    assert response.status_code == 400, response.text
    assert "Neo4j rejected the query" in response.json()["message"]


def _everything_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store sees both visibilities whatever the mode, and the ingress filter is off."""
    original = graph_access.graph_scope

    def graph_scope(ctx):
        return dataclasses.replace(original(ctx), visibilities=("public", "confidential"))

    monkeypatch.setattr(graph_access, "graph_scope", graph_scope)
    monkeypatch.setattr(graph_access, "may_see_value", lambda ctx, value: True)
    monkeypatch.setattr(graph_access, "may_see_entity", lambda ctx, entity: True)


def _another_team(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store is asked about the next team of the run; the ingress filter is off."""

    def graph_scope(ctx):
        team = ctx.team_id
        for a, b in (("dao_a_", "dao_b_"), ("dao_b_", "dao_c_"), ("dao_c_", "dao_a_")):
            if team.startswith(a):
                team = b + team[len(a) :]
                break
        return GraphScope(team_id=team, visibilities=ctx.allowed_visibilities)

    monkeypatch.setattr(graph_access, "graph_scope", graph_scope)
    monkeypatch.setattr(graph_access, "may_see_value", lambda ctx, value: True)
    monkeypatch.setattr(graph_access, "may_see_entity", lambda ctx, entity: True)


def _derived_entities_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entities documents made are checked like entities written directly (team and
    visibility only), as before issue 32: the store's statements lose the source check."""
    from deployments.graph_store import store as graph_store
    from deployments.graph_store.intents import source_visible

    def without(cypher: str) -> str:
        for v in set(re.findall(r"\b(\w+)\.team_id = \$team_id", cypher)):
            cypher = cypher.replace(source_visible(v), "true")
        return cypher

    for name, intent in graph_store.INTENTS.items():
        monkeypatch.setitem(
            graph_store.INTENTS, name, dataclasses.replace(intent, cypher=without(intent.cypher))
        )
    monkeypatch.setattr(graph_store, "ENTITIES", without(graph_store.ENTITIES))
    monkeypatch.setattr(graph_store, "RELATED_DOCS", without(graph_store.RELATED_DOCS))
    paths = graph_store.shortest_paths
    monkeypatch.setattr(graph_store, "shortest_paths", lambda hops: without(paths(hops)))


@pytest.mark.parametrize(
    "breakage, where",
    [
        (_everything_visible, {GRAPH_ENDPOINTS[0]}),
        (_another_team, {GRAPH_ENDPOINTS[0]}),
        # Entities only hidden documents made have no visible neighbour for an intent to
        # walk to: they surface as explain_path ends and in graph-boosted search.
        (_derived_entities_open, {GRAPH_ENDPOINTS[2], GRAPH_ENDPOINTS[4]}),
    ],
)
def test_a_broken_graph_access_path_is_reported_as_a_leak(settings, monkeypatch, breakage, where):
    breakage(monkeypatch)
    result = run_probes(200, seed=6, graph=True, neo4j=settings.neo4j)
    assert result["leaks_found"] > 0
    assert {leak["endpoint"] for leak in result["leaks"]} & where, result["leaks"][:3]
    assert result["graph_checks"]["left_after_clean_up"] == 0
