"""Knowledge graph over Neo4j: ``Neo4jGraph`` (the async driver, schema bootstrap,
idempotent MERGE of ingested documents, guarded caller Cypher, intents and paths, error
mapping) and the conversion of driver values to plain JSON. Every node and relationship
carries ``team_id`` and ``visibility``; Neo4j Community has one user database, so tenancy
lives in these properties. The Serve shell is deployments/graph.py."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from deployments.config import Neo4jSettings
from deployments.cypher_guard import CypherRejected, check_plan, check_query_type
from deployments.errors import (
    BackendUnavailable,
    Forbidden,
    InvalidQuery,
    NotFound,
    QueryLimitExceeded,
)
from deployments.graph_cypher import (
    DELETE_DOCUMENTS,
    ENTITIES,
    MERGE_DOCUMENTS,
    NODE_LABELS,
    RELATED_DOCS,
    RELATIONSHIPS,
    lucene_terms,
    schema_statements,
)
from deployments.graph_intents import INTENTS, entity_allowed
from deployments.protocols import GraphDocument, GraphScope

logger = logging.getLogger(__name__)


def _to_plain(value: Any) -> Any:
    """Neo4j values as JSON: nodes, relationships and paths become dicts with ``_type``."""
    from neo4j.graph import Node, Path, Relationship

    if isinstance(value, Node):
        return _node(value)
    if isinstance(value, Relationship):
        return _relationship(value)
    if isinstance(value, Path):
        return {
            "_type": "path",
            "nodes": [_node(n) for n in value.nodes],
            "relationships": [_relationship(r) for r in value.relationships],
        }
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if hasattr(value, "iso_format"):  # neo4j temporal types
        return value.iso_format()
    return value


# Node properties that only serve the gateway's own lookups.
_INTERNAL = ("wiki_id", "wiki_title")


def _node(node: Any) -> dict[str, Any]:
    props = {k: _to_plain(v) for k, v in dict(node).items() if k not in _INTERNAL}
    return {"_type": "node", "labels": sorted(node.labels), **props}


def _relationship(rel: Any) -> dict[str, Any]:
    def ref(n: Any) -> dict[str, Any]:
        return {"label": min(n.labels) if n.labels else "", "id": n.get("id")}

    props = {k: _to_plain(v) for k, v in dict(rel).items()}
    return {
        "_type": "relationship",
        "type": rel.type,
        "start": ref(rel.start_node),
        "end": ref(rel.end_node),
        **props,
    }


def node_label(node: dict[str, Any]) -> str:
    """A serialised node's first label (``Node`` when it has none)."""
    labels = node.get("labels") or []
    return labels[0] if labels else "Node"


class Neo4jGraph:
    """Async access to the Neo4j server.

    Args:
        settings: Bolt URI, credentials, database, timeouts and query bounds.
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
                        notifications_min_severity="OFF",
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

    async def _unavailable(self, exc: Exception) -> None:
        """Re-raise connection failures as ``BackendUnavailable`` (and reconnect next time);
        Neo4j's client errors as the gateway's 4xx errors."""
        from neo4j.exceptions import (
            ClientError,
            ServiceUnavailable,
            SessionExpired,
            TransientError,
        )

        if isinstance(exc, ServiceUnavailable | SessionExpired | OSError):
            await self._reset()
            raise BackendUnavailable("neo4j", f"query failed: {exc}") from exc
        code = getattr(exc, "code", "") or ""
        message = getattr(exc, "message", None) or str(exc)
        if "TransactionTimedOut" in code or "Transaction.TransactionTimedOut" in code:
            raise QueryLimitExceeded(
                f"the query ran past the {self.settings.query_timeout_s:g} s timeout",
                reason="timeout",
                hint="narrow the query (labels, LIMIT) or use a named intent",
            ) from exc
        if "MemoryPoolOutOfMemory" in code or "MemoryLimit" in code:
            raise QueryLimitExceeded(
                f"the query needs more memory than a transaction may use: {message}",
                reason="memory",
            ) from exc
        if isinstance(exc, ClientError) and code.startswith("Neo.ClientError.Security."):
            raise Forbidden(
                f"Neo4j refused the query: {message}", reason="neo4j_security", field="cypher"
            ) from exc
        if isinstance(exc, ClientError):
            # Syntax, semantics, unknown procedures, a procedure that failed on its arguments:
            # the caller's query, said in Neo4j's words.
            raise InvalidQuery(f"Neo4j rejected the query: {message}") from exc
        if isinstance(exc, TransientError):
            raise BackendUnavailable("neo4j", f"transient failure: {message}") from exc
        raise exc

    async def run(
        self, query: str, params: dict[str, Any] | None = None, *, write: bool = False
    ) -> list[dict[str, Any]]:
        """Run one trusted parameterised statement and return its records as dicts."""
        from neo4j import Query

        await self.start()
        try:
            records, _, _ = await self._driver.execute_query(
                Query(query, timeout=self.settings.write_timeout_s),
                params or {},
                database_=self.settings.database,
                routing_="w" if write else "r",
            )
        except Exception as exc:
            await self._unavailable(exc)
            raise
        return [r.data() for r in records]

    async def _read(
        self, query: str, params: dict[str, Any], *, max_rows: int
    ) -> tuple[list[str], list[list[Any]]]:
        """A READ-mode transaction with the query timeout; more than ``max_rows`` records is
        ``QueryLimitExceeded`` (fetching stops there)."""
        from neo4j import READ_ACCESS, unit_of_work

        timeout = self.settings.query_timeout_s

        @unit_of_work(timeout=timeout)
        async def work(tx: Any) -> tuple[list[str], list[list[Any]]]:
            result = await tx.run(query, params)
            keys = list(result.keys())
            rows: list[list[Any]] = []
            async for record in result:
                if len(rows) >= max_rows:
                    raise QueryLimitExceeded(
                        f"the query returns more than {max_rows} rows",
                        reason="row_limit",
                        hint=f"add LIMIT {max_rows} or narrow the query",
                    )
                rows.append([_to_plain(v) for v in record.values()])
            return keys, rows

        await self.start()
        try:
            async with self._driver.session(
                database=self.settings.database, default_access_mode=READ_ACCESS
            ) as session:
                return await session.execute_read(work)
        except QueryLimitExceeded:
            raise
        except Exception as exc:
            await self._unavailable(exc)
            raise

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
                "author_id": d.author_id,
                "tags": list(d.tags),
                "links": list(d.links),
                "wiki_id": d.wiki_id or None,
                "wiki_title": d.wiki_title or None,
                "created_at": d.created_at,
            }
            for d in docs
        ]
        rows = await self.run(MERGE_DOCUMENTS, {"docs": payload}, write=True)
        return int(rows[0]["merged"]) if rows else 0

    async def delete_documents(self, team_id: str, doc_ids: list[str]) -> int:
        """Remove the team's ``Doc`` nodes of ``doc_ids`` with their relationships; the
        entities they pointed at (Project, Channel, Topic, User, Agent) stay, and wiki-links
        from other notes move to a placeholder of the deleted note."""
        if not doc_ids:
            return 0
        rows = await self.run(
            DELETE_DOCUMENTS, {"team_id": team_id, "ids": list(doc_ids)}, write=True
        )
        return int(rows[0]["deleted"]) if rows else 0

    async def upsert_entities(
        self, team_id: str, nodes: list[dict[str, Any]], relationships: list[dict[str, Any]]
    ) -> dict[str, int]:
        """MERGE entities and relationships of one team (validated by the caller: labels and
        types from the vocabulary, no reserved property names). Relationship ends that do
        not exist yet are created with the relationship's visibility."""
        merged = {"nodes": 0, "relationships": 0}
        by_label: dict[str, list[dict[str, Any]]] = {}
        for node in nodes:
            by_label.setdefault(node["label"], []).append(node)
        for label, group in by_label.items():
            if label not in NODE_LABELS:
                raise ValueError(f"unknown label {label!r}")
            rows = await self.run(
                f"""
UNWIND $nodes AS n
MERGE (x:{label} {{team_id: $team_id, id: n.id}})
SET x += n.properties, x.name = coalesce(n.name, x.name, n.id), x.visibility = n.visibility
RETURN count(x) AS c
""",
                {"team_id": team_id, "nodes": group},
                write=True,
            )
            merged["nodes"] += int(rows[0]["c"]) if rows else 0
        by_type: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for rel in relationships:
            key = (rel["type"], rel["from_label"], rel["to_label"])
            by_type.setdefault(key, []).append(rel)
        for (rtype, from_label, to_label), group in by_type.items():
            if rtype not in RELATIONSHIPS or {from_label, to_label} - set(NODE_LABELS):
                raise ValueError(f"unknown relationship {rtype} {from_label}->{to_label}")
            rows = await self.run(
                f"""
UNWIND $rels AS r
MERGE (a:{from_label} {{team_id: $team_id, id: r.from_id}})
  ON CREATE SET a.name = r.from_id, a.visibility = r.visibility
SET a.visibility = CASE WHEN r.visibility = 'public' THEN 'public' ELSE a.visibility END
MERGE (b:{to_label} {{team_id: $team_id, id: r.to_id}})
  ON CREATE SET b.name = r.to_id, b.visibility = r.visibility
SET b.visibility = CASE WHEN r.visibility = 'public' THEN 'public' ELSE b.visibility END
MERGE (a)-[x:{rtype}]->(b)
SET x += r.properties, x.team_id = $team_id, x.visibility = r.visibility
RETURN count(x) AS c
""",
                {"team_id": team_id, "rels": group},
                write=True,
            )
            merged["relationships"] += int(rows[0]["c"]) if rows else 0
        return merged

    async def run_intent(
        self, name: str, args: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        intent = INTENTS[name]
        columns, rows = await self._read(
            intent.cypher, {**args, **scope.params}, max_rows=self.settings.max_rows
        )
        return {"columns": columns, "rows": rows}

    async def check_cypher(
        self, query: str, params: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        """EXPLAIN the query in a READ session and prove it read-only and scoped.

        Raises:
            Forbidden: writes, admin commands, disallowed procedures or an unscoped variable
                (``reason`` says which).
            InvalidQuery: Neo4j cannot compile it (its message kept).
        """
        from neo4j import READ_ACCESS

        await self.start()
        try:
            async with self._driver.session(
                database=self.settings.database, default_access_mode=READ_ACCESS
            ) as session:
                result = await session.run("EXPLAIN " + query, {**params, **scope.params})
                summary = await result.consume()
        except Exception as exc:
            await self._unavailable(exc)
            raise
        try:
            check_query_type(summary.query_type)
            check_plan(
                summary.plan or {},
                restrict_visibility="confidential" not in scope.visibilities,
                database=self.settings.database,
            )
        except CypherRejected as exc:
            raise Forbidden(
                f"query refused: {exc.message}",
                reason=exc.reason,
                field="cypher",
                hint="see docs/graph_schema.md, 'Caller Cypher', or GET /graph/intents",
            ) from exc
        return {"query_type": summary.query_type}

    async def run_cypher(
        self, query: str, params: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        await self.check_cypher(query, params, scope)
        columns, rows = await self._read(
            query, {**params, **scope.params}, max_rows=self.settings.max_rows
        )
        return {"columns": columns, "rows": rows}

    async def _resolve(
        self, ref: dict[str, Any], scope: GraphScope, limit: int = 5
    ) -> list[dict[str, Any]]:
        _, rows = await self._read(
            f"""
MATCH (a)
WHERE a.team_id = $team_id AND a.visibility IN $visibilities AND NOT coalesce(a.stub, false)
  AND ($label IS NULL OR $label IN labels(a)) AND {entity_allowed("a")}
  AND (a.id = $ref OR toLower(coalesce(a.name, a.title, '')) = toLower($ref))
RETURN a ORDER BY a.id = $ref DESC, a.id LIMIT $limit
""",
            {"ref": ref["ref"], "label": ref.get("label"), "limit": limit, **scope.params},
            max_rows=limit,
        )
        return [row[0] for row in rows]

    async def explain_path(
        self,
        source: dict[str, Any],
        target: dict[str, Any],
        scope: GraphScope,
        max_hops: int,
        max_paths: int,
    ) -> dict[str, Any]:
        """Shortest paths (every node and relationship inside ``scope``) between the
        entities ``source`` and ``target`` name (``{"ref": id or name, "label": ...}``).

        Raises:
            NotFound: an end names nothing in the scope.
        """
        ends = []
        for side, ref in (("from", source), ("to", target)):
            found = await self._resolve(ref, scope)
            if not found:
                label = f" with label {ref['label']}" if ref.get("label") else ""
                raise NotFound(
                    f"no entity {ref['ref']!r}{label} in team {scope.team_id!r} within your "
                    "visibility",
                    field=side,
                    hint="name an entity by its id, name or title (GET /graph/intents: "
                    "ENTITY_NEIGHBOURS helps to explore)",
                )
            ends.append(found)
        hops = max(1, min(int(max_hops), self.settings.max_path_hops))
        _, rows = await self._read(
            f"""
MATCH (a) WHERE a.team_id = $team_id AND any(k IN $sources WHERE a.id = k[1] AND k[0] IN labels(a))
MATCH (b) WHERE b.team_id = $team_id AND any(k IN $targets WHERE b.id = k[1] AND k[0] IN labels(b))
WITH a, b WHERE a <> b
MATCH p = allShortestPaths((a)-[*..{hops}]-(b))
WHERE all(n IN nodes(p) WHERE n.team_id = $team_id AND n.visibility IN $visibilities
                              AND NOT coalesce(n.stub, false) AND {entity_allowed("n")})
  AND all(r IN relationships(p) WHERE r.visibility IN $visibilities)
RETURN p ORDER BY length(p) LIMIT $max_paths
""",
            {
                "sources": [[node_label(n), n["id"]] for n in ends[0]],
                "targets": [[node_label(n), n["id"]] for n in ends[1]],
                "max_paths": max_paths,
                **scope.params,
            },
            max_rows=max_paths,
        )
        return {"source": ends[0], "target": ends[1], "paths": [row[0] for row in rows]}

    async def related_docs(
        self, text: str, scope: GraphScope, max_entities: int, max_docs: int
    ) -> dict[str, Any]:
        lucene = lucene_terms(text)
        if not lucene:
            return {"entities": [], "docs": {}}
        params = {
            "lucene": lucene,
            "max_entities": max_entities,
            "max_docs": max_docs,
            **scope.params,
        }
        _, entity_rows = await self._read(ENTITIES, params, max_rows=max_entities)
        if not entity_rows:
            return {"entities": [], "docs": {}}
        _, rows = await self._read(RELATED_DOCS, params, max_rows=max_docs)
        return {
            "entities": [
                {"node": node, "score": round(float(score), 4)} for node, score in entity_rows
            ],
            "docs": {doc_id: float(score) for doc_id, score, _ in rows},
        }

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
