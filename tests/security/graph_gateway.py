"""The graph probes' harness around the real Neo4j: the in-process gateway (fakes for
vectors and embeddings, the real graph) the probes send their requests to, and a driver of
its own that snapshots the run's teams to catch a write that went through, and deletes them
at the end.
"""

from __future__ import annotations

import json
from typing import Any


class GraphGateway:
    """The in-process gateway (TestClient) over fakes for vectors and embeddings and the
    real Neo4j for the graph; the async driver lives in the client's event loop."""

    def __init__(self, auth: dict[str, Any], policy: Any, neo4j: Any, store: Any = None) -> None:
        from fastapi.testclient import TestClient

        from batch_ingest.chunking import whitespace_tokens
        from deployments.graph_store.store import Neo4jGraph
        from deployments.protocols import Backends
        from deployments.testing.fakes import FakeEmbedder, FakeVectorStore
        from serve_app.asgi import create_app
        from serve_app.composition import build_services
        from serve_app.settings import GatewaySettings

        settings = GatewaySettings(environment="test", auth=auth, neo4j=neo4j)
        self.embedder = FakeEmbedder(dim=32)
        self.store = store if store is not None else FakeVectorStore()
        self.graph = Neo4jGraph(settings.neo4j)
        self.services = build_services(
            settings,
            Backends(embedder=self.embedder, store=self.store, graph=self.graph),
            count_tokens=whitespace_tokens,
            policy=policy,
        )
        self.client = TestClient(create_app(self.services), raise_server_exceptions=False)
        # One event loop for the client's lifetime (the async driver is bound to it).
        self.client.__enter__()

    def post(self, path: str, body: Any, headers: dict[str, str]) -> Any:
        response = self.client.post(path, json=body, headers=headers)
        # Kept for the leak report.
        response.request_body = json.dumps(body, ensure_ascii=False, default=str)[:800]
        return response

    def close(self) -> None:
        try:
            self.client.portal.call(self.graph.close)
        finally:
            self.client.__exit__(None, None, None)


class GraphSnapshots:
    """A synchronous driver (outside the gateway) for seeding checks, write detection and
    the final clean-up of the run's teams."""

    def __init__(self, neo4j: Any, teams: tuple[str, ...], tag: str) -> None:
        from neo4j import GraphDatabase

        self.driver = GraphDatabase.driver(neo4j.uri, auth=(neo4j.user, neo4j.password))
        self.database = neo4j.database
        self.teams = list(teams)
        self.tag = tag

    def query(self, cypher: str, **params: Any) -> list[dict[str, Any]]:
        records, _, _ = self.driver.execute_query(cypher, params, database_=self.database)
        return [r.data() for r in records]

    def snapshot(self) -> frozenset[str]:
        """Every node and relationship of the run's teams, with all properties."""
        nodes = self.query(
            "MATCH (n) WHERE n.team_id IN $teams "
            "RETURN elementId(n) AS e, labels(n) AS l, properties(n) AS p",
            teams=self.teams,
        )
        rels = self.query(
            "MATCH (a)-[r]-(b) WHERE a.team_id IN $teams "
            "RETURN DISTINCT elementId(r) AS e, type(r) AS t, properties(r) AS p, "
            "elementId(startNode(r)) AS s, elementId(endNode(r)) AS d",
            teams=self.teams,
        )
        return frozenset(repr(sorted((k, repr(v)) for k, v in row.items())) for row in nodes + rels)

    def counts(self) -> dict[str, int]:
        rows = self.query(
            "MATCH (n) WHERE n.team_id IN $teams RETURN n.team_id AS t, count(n) AS c",
            teams=self.teams,
        )
        return {r["t"]: r["c"] for r in rows}

    def sentinels(self) -> int:
        """Nodes anywhere holding the write sentinel of this run (a Cypher write that
        went through, in any team)."""
        rows = self.query(
            "MATCH (n) WHERE n.id CONTAINS $s OR n.pwned CONTAINS $s RETURN count(n) AS c",
            s="pwn_" + self.tag,
        )
        labels = self.query("CALL db.labels() YIELD label RETURN collect(label) AS l")
        extra = sum(1 for label in labels[0]["l"] if self.tag in label) if labels else 0
        return int(rows[0]["c"]) + extra if rows else extra

    def clean(self) -> None:
        """DETACH DELETE everything of the run's teams (and anything holding its tag)."""
        self.query("MATCH (n) WHERE n.team_id IN $teams DETACH DELETE n", teams=self.teams)
        self.query(
            "MATCH (n) WHERE n.id CONTAINS $tag OR n.pwned CONTAINS $tag DETACH DELETE n",
            tag=self.tag,
        )

    def close(self) -> None:
        self.driver.close()
