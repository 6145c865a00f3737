"""Planning the gateway's own graph reads ahead (deployments/graph_store/warmup.py)."""

from __future__ import annotations

import asyncio
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

    def __init__(self, failing: tuple[str, ...] = (), times: int = 99, up: bool = True) -> None:
        super().__init__(Neo4jSettings())
        self.failing = dict.fromkeys(failing, times)  # text -> failures left
        self.up = up
        self.deadlines: list[float | None] = []
        self.explained: list[tuple[str, dict[str, Any]]] = []

    async def start(self, deadline_s: float | None = None) -> None:
        self.deadlines.append(deadline_s)
        if not self.up:
            raise BackendUnavailable("neo4j", "cannot reach it")

    async def explain(
        self, query: str, params: dict[str, Any], *, deadline_s: float | None = None
    ) -> Any:
        self.deadlines.append(deadline_s)
        if self.failing.get(query):
            self.failing[query] -= 1
            raise BackendUnavailable("neo4j", "no answer within 5 s (EXPLAIN)")
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


async def test_a_statement_that_timed_out_once_is_planned_after_the_others():
    """In a fresh Neo4j on busy cores the first plans ran past a caller's deadline."""
    first, second = bundled(own_reads()[0][1]), bundled(own_reads()[1][1])
    client = ExplainingClient(failing=(first, second), times=1)
    assert await warm_plans(client, patience_s=12.5) == len(own_reads())
    assert [q for q, _ in client.explained][-2:] == [first, second]
    # no caller waits: every step had the warm-up's patience, not a caller's deadline
    assert set(client.deadlines) == {12.5}


async def test_no_neo4j_no_plans_and_no_waiting_per_statement():
    client = ExplainingClient(up=False)
    assert await warm_plans(client) == 0
    assert client.explained == [] and len(client.deadlines) == 1


async def new_replica(settings: Neo4jSettings) -> Any:
    """A ``GraphDeployment`` built the way Serve builds one (its constructor awaited)."""
    from deployments.graph_store.deployment import GraphDeployment

    replica = GraphDeployment.__new__(GraphDeployment)
    await replica.__init__(settings)
    return replica


async def test_a_graph_replica_is_ready_only_once_its_reads_are_planned(monkeypatch):
    from deployments.graph_store import deployment

    planned: list[Neo4jClient] = []

    async def warm(client: Neo4jClient) -> int:
        await asyncio.sleep(0.05)
        planned.append(client)
        return 0

    monkeypatch.setattr(deployment, "warm_plans", warm)
    replica = await new_replica(Neo4jSettings())
    assert planned == [replica.graph.client]
    assert replica._warm_up.done()


async def test_a_slow_warm_up_goes_on_in_the_background_after_the_wait(monkeypatch, caplog):
    from deployments.graph_store import deployment

    release = asyncio.Event()

    async def warm(client: Neo4jClient) -> int:
        await release.wait()
        return 7

    monkeypatch.setattr(deployment, "warm_plans", warm)
    monkeypatch.setattr(deployment, "WARM_UP_WAIT_S", 0.05)
    replica = await new_replica(Neo4jSettings())
    assert not replica._warm_up.done()
    assert "still planning" in caplog.text
    release.set()
    assert await replica._warm_up == 7
