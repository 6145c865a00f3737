"""The graph's Serve shell: ``GraphDeployment`` over ``Neo4jGraph`` (store.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from deployments.config import Neo4jSettings
from deployments.graph_store.store import Neo4jGraph
from deployments.graph_store.warmup import warm_plans
from deployments.health import BackendHealth
from deployments.protocols import GraphDocument, GraphScope
from deployments.serve_log import route_logs_to_serve

logger = logging.getLogger(__name__)
# How long a new replica waits for its warm-up before it reports ready; the rest of the
# warm-up goes on in the background (Neo4j slow, or away: its first callers plan instead).
WARM_UP_WAIT_S = 60.0


def deployment_options(settings: Neo4jSettings) -> dict[str, Any]:
    """Serve options of ``GraphDeployment`` (I/O to Neo4j)."""
    return {"name": "Graph", "max_ongoing_requests": 64, "ray_actor_options": {"num_cpus": 0.1}}


class GraphDeployment:
    """Serve shell over ``Neo4jGraph``."""

    async def __init__(self, settings: Neo4jSettings) -> None:  # type: ignore[misc]
        """Serve awaits it (``serve.deployment`` takes an async constructor); elsewhere:
        ``replica = GraphDeployment.__new__(GraphDeployment); await replica.__init__(s)``."""
        route_logs_to_serve()
        self.graph = Neo4jGraph(settings)
        self.health = BackendHealth("neo4j", self.graph.status)
        # Plan the gateway's own reads before the replica takes calls (warmup.py): a plan paid
        # by a caller counts against its 5 s transaction timeout, and on a busy 2-vCPU machine
        # one took 5.9 s (503). Serve awaits an async constructor before the replica is ready.
        self._warm_up = asyncio.create_task(warm_plans(self.graph.client))
        try:
            await asyncio.wait_for(asyncio.shield(self._warm_up), WARM_UP_WAIT_S)
        except TimeoutError:
            logger.warning(
                "graph: warm-up still planning after %.0f s; the replica takes calls now",
                WARM_UP_WAIT_S,
            )

    async def check_health(self) -> None:
        """Serve's health check: fails the replica after Neo4j failed several in a row."""
        await self.health.check()

    async def merge_documents(self, docs: list[GraphDocument]) -> int:
        return await self.graph.merge_documents(docs)

    async def delete_documents(self, team_id: str, doc_ids: list[str]) -> int:
        return await self.graph.delete_documents(team_id, doc_ids)

    async def upsert_entities(
        self,
        team_id: str,
        nodes: list[dict[str, Any]],
        relationships: list[dict[str, Any]],
        scope: GraphScope,
    ) -> dict[str, Any]:
        return await self.graph.upsert_entities(team_id, nodes, relationships, scope)

    async def run_intent(
        self, name: str, args: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        return await self.graph.run_intent(name, args, scope)

    async def run_cypher(
        self, query: str, params: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        return await self.graph.run_cypher(query, params, scope)

    async def acl_hidden(self, scope: GraphScope) -> bool:
        return await self.graph.acl_hidden(scope)

    async def explain_path(
        self,
        source: dict[str, Any],
        target: dict[str, Any],
        scope: GraphScope,
        max_hops: int,
        max_paths: int,
    ) -> dict[str, Any]:
        return await self.graph.explain_path(source, target, scope, max_hops, max_paths)

    async def related_docs(
        self, text: str, scope: GraphScope, max_entities: int, max_docs: int
    ) -> dict[str, Any]:
        return await self.graph.related_docs(text, scope, max_entities, max_docs)

    async def status(self) -> dict[str, Any]:
        return await self.graph.status()
