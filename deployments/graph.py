"""Knowledge graph over Neo4j: schema bootstrap, idempotent MERGE of ingested documents.

``Neo4jGraph`` is the core class (async driver); ``GraphDeployment`` is its Serve shell.
The labels and relationships are documented in docs/graph_schema.md. Every node and
relationship carries ``team_id`` and ``visibility``; Neo4j Community has one user database,
so tenancy lives in these properties.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from deployments.config import Neo4jSettings
from deployments.errors import BackendUnavailable
from deployments.protocols import GraphDocument

logger = logging.getLogger(__name__)

# The graph vocabulary of docs/graph_schema.md.
NODE_LABELS = (
    "User",
    "Agent",
    "MicroDAO",
    "Project",
    "Channel",
    "Topic",
    "Resource",
    "File",
    "RWAObject",
    "Doc",
)
RELATIONSHIPS = (
    "MEMBER_OF",
    "SERVES",
    "MENTIONS",
    "USES",
    "LINKS_TO",
    "PART_OF",
    "POSTED_IN",
    "AUTHORED",
)


def schema_statements() -> list[str]:
    """Constraints and indexes created idempotently at start."""
    statements = []
    for label in NODE_LABELS:
        low = label.lower()
        statements.append(
            f"CREATE CONSTRAINT {low}_team_id IF NOT EXISTS FOR (n:{label}) "
            "REQUIRE (n.team_id, n.id) IS UNIQUE"
        )
        statements.append(
            f"CREATE INDEX {low}_team_visibility IF NOT EXISTS FOR (n:{label}) "
            "ON (n.team_id, n.visibility)"
        )
    statements.append(
        "CREATE FULLTEXT INDEX entity_names IF NOT EXISTS FOR (n:"
        + "|".join(NODE_LABELS)
        + ") ON EACH [n.name, n.title]"
    )
    return statements


# One statement for a batch of documents. An entity node (project, channel, agent, topic) is
# public as soon as one public document names it; a confidential-only entity stays
# confidential. MERGE on (team_id, id) makes re-ingestion a no-op.
MERGE_DOCUMENTS = """
UNWIND $docs AS d
MERGE (dao:MicroDAO {team_id: d.team_id, id: d.team_id})
  ON CREATE SET dao.name = d.team_id, dao.visibility = 'public'
MERGE (doc:Doc {team_id: d.team_id, id: d.doc_id})
SET doc.title = d.title, doc.visibility = d.visibility, doc.doc_type = d.doc_type,
    doc.url = d.url, doc.created_at = d.created_at, doc.tags = d.tags
WITH d, doc
CALL (d, doc) {
  WITH d, doc WHERE d.project_id <> ''
  MERGE (p:Project {team_id: d.team_id, id: d.project_id})
    ON CREATE SET p.name = d.project_id, p.visibility = d.visibility
  SET p.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE p.visibility END
  MERGE (doc)-[r:PART_OF]->(p)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.channel_id <> ''
  MERGE (c:Channel {team_id: d.team_id, id: d.channel_id})
    ON CREATE SET c.name = d.channel_id, c.visibility = d.visibility
  SET c.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE c.visibility END
  MERGE (doc)-[r:POSTED_IN]->(c)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.agent_id <> ''
  MERGE (a:Agent {team_id: d.team_id, id: d.agent_id})
    ON CREATE SET a.name = d.agent_id, a.visibility = d.visibility
  SET a.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE a.visibility END
  MERGE (a)-[r:AUTHORED]->(doc)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  UNWIND d.tags AS tag
  MERGE (t:Topic {team_id: d.team_id, id: tag})
    ON CREATE SET t.name = tag, t.visibility = d.visibility
  SET t.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE t.visibility END
  MERGE (doc)-[r:MENTIONS]->(t)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
RETURN count(doc) AS merged
"""


class Neo4jGraph:
    """Async access to the Neo4j server.

    Args:
        settings: Bolt URI, credentials, database and timeout.
    """

    def __init__(self, settings: Neo4jSettings) -> None:
        self.settings = settings
        self._driver: Any = None
        self._schema_ready = False
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect and create the schema; idempotent."""
        async with self._lock:
            if self._schema_ready:
                return
            from neo4j import AsyncGraphDatabase

            try:
                if self._driver is None:
                    self._driver = AsyncGraphDatabase.driver(
                        self.settings.uri,
                        auth=(self.settings.user, self.settings.password),
                        connection_timeout=self.settings.timeout_s,
                    )
                await self._driver.verify_connectivity()
                for statement in schema_statements():
                    await self._driver.execute_query(statement, database_=self.settings.database)
            except Exception as exc:
                await self._reset()
                raise BackendUnavailable(
                    "neo4j",
                    f"cannot reach {self.settings.uri}: {exc}",
                    hint="start it with `python scripts/services.py up` or set NEO4J__URI",
                ) from exc
            self._schema_ready = True

    async def _reset(self) -> None:
        if self._driver is not None:
            try:
                await self._driver.close()
            finally:
                self._driver = None
        self._schema_ready = False

    async def run(
        self, query: str, params: dict[str, Any] | None = None, *, write: bool = False
    ) -> list[dict[str, Any]]:
        """Run one parameterised statement and return its records as dicts."""
        await self.start()
        try:
            records, _, _ = await self._driver.execute_query(
                query,
                params or {},
                database_=self.settings.database,
                routing_="w" if write else "r",
            )
        except Exception as exc:
            from neo4j.exceptions import ServiceUnavailable, SessionExpired

            if isinstance(exc, ServiceUnavailable | SessionExpired | OSError):
                await self._reset()
                raise BackendUnavailable("neo4j", f"query failed: {exc}") from exc
            raise
        return [r.data() for r in records]

    async def merge_documents(self, docs: list[GraphDocument]) -> int:
        if not docs:
            return 0
        payload = [
            {
                "team_id": d.team_id,
                "doc_id": d.doc_id,
                "title": d.title,
                "visibility": d.visibility,
                "doc_type": d.doc_type,
                "url": d.url,
                "project_id": d.project_id,
                "channel_id": d.channel_id,
                "agent_id": d.agent_id,
                "tags": list(d.tags),
                "created_at": d.created_at,
            }
            for d in docs
        ]
        rows = await self.run(MERGE_DOCUMENTS, {"docs": payload}, write=True)
        return int(rows[0]["merged"]) if rows else 0

    async def status(self) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            await self.start()
            await self.run("RETURN 1 AS ok")
        except Exception as exc:
            return {"ready": False, "uri": self.settings.uri, "error": str(exc)}
        return {
            "ready": True,
            "uri": self.settings.uri,
            "latency_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    async def close(self) -> None:
        async with self._lock:
            await self._reset()


class GraphDeployment:
    """Serve shell over ``Neo4jGraph``."""

    def __init__(self, settings: Neo4jSettings) -> None:
        self.graph = Neo4jGraph(settings)

    async def merge_documents(self, docs: list[GraphDocument]) -> int:
        return await self.graph.merge_documents(docs)

    async def status(self) -> dict[str, Any]:
        return await self.graph.status()
