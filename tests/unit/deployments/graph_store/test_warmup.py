"""Planning the gateway's own graph reads ahead (deployments/graph_store/warmup.py)."""

from __future__ import annotations

from typing import Any

from deployments.config import Neo4jSettings
from deployments.errors import BackendUnavailable
from deployments.graph_store.client import Neo4jClient
from deployments.graph_store.cypher import shortest_paths
from deployments.graph_store.intents import INTENTS
from deployments.graph_store.params import bundled
from deployments.graph_store.warmup import own_reads, warm_plans
from serve_app.graph.contracts import ExplainPathRequest


class ExplainingClient(Neo4jClient):
    """Records what would be EXPLAINed; fails for the texts in ``failing``."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        super().__init__(Neo4jSettings())
        self.failing = failing
        self.explained: list[tuple[str, dict[str, Any]]] = []

    async def explain(self, query: str, params: dict[str, Any]) -> Any:
        if query in self.failing:
            raise BackendUnavailable("neo4j is away")
        self.explained.append((query, params))
        return None


async def test_every_intent_and_own_statement_is_explained_as_it_runs():
    client = ExplainingClient()
    assert await warm_plans(client) == len(own_reads())
    texts = [q for q, _ in client.explained]
    assert {bundled(i.cypher) for i in INTENTS.values()} <= set(texts)
    # explain_path's query with the bound a request gets when it names none
    assert bundled(shortest_paths(ExplainPathRequest.model_fields["max_hops"].default)) in texts
    assert len(texts) == len(INTENTS) + 5
    # bundled text, its parameters in the one map, the scope's among them
    assert all(list(params) == ["p"] and "team_id" in params["p"] for _, params in client.explained)


async def test_a_statement_that_cannot_be_planned_is_left_to_its_first_caller():
    first = bundled(own_reads()[0][1])
    client = ExplainingClient(failing=(first,))
    assert await warm_plans(client) == len(own_reads()) - 1
    assert first not in [q for q, _ in client.explained]


async def test_a_graph_replica_plans_ahead_on_its_event_loop(monkeypatch):
    from deployments.graph_store import deployment

    started: list[Neo4jClient] = []

    async def warm(client: Neo4jClient) -> int:
        started.append(client)
        return 0

    monkeypatch.setattr(deployment, "warm_plans", warm)
    replica = deployment.GraphDeployment(Neo4jSettings())
    assert replica._warm_up is not None
    await replica._warm_up
    assert started == [replica.graph.client]


def test_a_graph_replica_built_outside_a_loop_leaves_planning_to_its_callers():
    from deployments.graph_store.deployment import GraphDeployment

    assert GraphDeployment(Neo4jSettings())._warm_up is None
