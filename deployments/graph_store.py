"""Knowledge graph over Neo4j: ``Neo4jGraph`` (idempotent MERGE of ingested documents and
entities, guarded caller Cypher, intents, paths and related documents). Every node and
relationship carries ``team_id`` and ``visibility``; Neo4j Community has one user database,
so tenancy lives in these properties. Beside it: graph_client.py (the driver, transactions,
error mapping), graph_values.py (driver values → JSON), graph_cypher.py (the statements),
graph_intents.py, cypher_guard.py; the Serve shell is deployments/graph.py."""

from __future__ import annotations

import logging
import time
from typing import Any

from deployments import acl
from deployments.config import Neo4jSettings
from deployments.cypher_guard import CypherRejected, check_plan, check_query_type
from deployments.cypher_scope import scope_query
from deployments.errors import Forbidden, InvalidInput, InvalidQuery, NotFound
from deployments.graph_client import Neo4jClient
from deployments.graph_cypher import (
    ACL_HIDDEN,
    DELETE_DOCUMENTS,
    ENTITIES,
    MERGE_DOCUMENTS,
    NODE_LABELS,
    RELATED_DOCS,
    RELATIONSHIPS,
    lucene_terms,
    merge_nodes,
    merge_relationships,
)
from deployments.graph_intents import INTENTS, entity_allowed
from deployments.graph_values import node_label
from deployments.protocols import GraphDocument, GraphScope

logger = logging.getLogger(__name__)


def _doc_row(d: GraphDocument) -> dict[str, Any]:
    """One ``$docs`` row of ``MERGE_DOCUMENTS``; an empty allow list is stored as open.
    ``acl_restricted`` is ``true`` or absent (null removes it), so the index behind
    ``ACL_HIDDEN`` holds only the documents whose access list restricts someone."""
    allow = list(d.acl_allow) or list(acl.OPEN_ALLOW)
    return {
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
        "acl_allow": allow,
        "acl_deny": list(d.acl_deny),
        "acl_restricted": None if acl.is_open(allow, d.acl_deny) else True,
    }


def _refused(exc: CypherRejected) -> Forbidden:
    return Forbidden(
        f"query refused: {exc.message}",
        reason=exc.reason,
        field="cypher",
        hint="see docs/graph_schema.md, 'Caller Cypher', or GET /graph/intents",
    )


class Neo4jGraph:
    """Async access to the Neo4j server.

    Args:
        settings: Bolt URI, credentials, database, timeouts and query bounds.
    """

    def __init__(self, settings: Neo4jSettings) -> None:
        self.settings = settings
        self.client = Neo4jClient(settings)

    async def start(self) -> None:
        """Connect and create the schema; idempotent."""
        await self.client.start()

    async def merge_documents(self, docs: list[GraphDocument]) -> int:
        """MERGE documents with their edges and entities (``MERGE_DOCUMENTS``); every
        ``Doc`` gets its current access list. Returns how many were merged."""
        if not docs:
            return 0
        payload = [_doc_row(d) for d in docs]
        rows = await self.client.run(MERGE_DOCUMENTS, {"docs": payload}, write=True)
        return int(rows[0]["merged"]) if rows else 0

    async def delete_documents(self, team_id: str, doc_ids: list[str]) -> int:
        """Remove the team's ``Doc`` nodes of ``doc_ids`` with their relationships; the
        entities they pointed at (Project, Channel, Topic, User, Agent) stay, and wiki-links
        from other notes move to a placeholder of the deleted note."""
        if not doc_ids:
            return 0
        rows = await self.client.run(
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
                raise InvalidInput(f"unknown label {label!r}")
            rows = await self.client.run(
                merge_nodes(label), {"team_id": team_id, "nodes": group}, write=True
            )
            merged["nodes"] += int(rows[0]["c"]) if rows else 0
        by_type: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for rel in relationships:
            key = (rel["type"], rel["from_label"], rel["to_label"])
            by_type.setdefault(key, []).append(rel)
        for (rtype, from_label, to_label), group in by_type.items():
            if rtype not in RELATIONSHIPS or {from_label, to_label} - set(NODE_LABELS):
                raise InvalidInput(f"unknown relationship {rtype} {from_label}->{to_label}")
            rows = await self.client.run(
                merge_relationships(rtype, from_label, to_label),
                {"team_id": team_id, "rels": group},
                write=True,
            )
            merged["relationships"] += int(rows[0]["c"]) if rows else 0
        return merged

    async def run_intent(
        self, name: str, args: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        intent = INTENTS[name]
        columns, rows = await self.client.read(
            intent.cypher, {**args, **scope.params}, max_rows=self.settings.max_rows
        )
        return {"columns": columns, "rows": rows}

    async def check_cypher(
        self, query: str, params: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        """EXPLAIN the query in a READ session and prove it read-only and scoped. A simple
        query refused only as unscoped (MATCH / OPTIONAL MATCH clauses, then RETURN) is
        scoped by the gateway instead (``cypher_scope.scope_query``: every variable it binds
        gets the team predicate, and the visibility one where the scope demands it) and the
        rewritten text proven the same way; ``cypher`` is the text to run.

        Raises:
            Forbidden: writes, admin commands, disallowed procedures or an unscoped variable
                (``reason`` says which; for a rewritten query, the refusal of the original).
            InvalidQuery: Neo4j cannot compile it (its message kept).
        """
        restrict = "confidential" not in scope.visibilities
        bound = {**params, **scope.params}
        summary = await self.client.explain(query, bound)
        try:
            self._prove(summary, restrict)
        except CypherRejected as exc:
            scoped = None
            if exc.reason == "unscoped_variable":
                scoped = scope_query(query, restrict_visibility=restrict)
            if scoped is None:
                raise _refused(exc) from exc
            try:
                summary = await self.client.explain(scoped, bound)
                self._prove(summary, restrict)
            except (CypherRejected, InvalidQuery) as again:
                logger.info("graph: the scoped form of a refused query is refused too: %s", again)
                raise _refused(exc) from exc
            logger.debug("graph: caller Cypher scoped by the gateway: %s", scoped)
            query = scoped
        return {"query_type": summary.query_type, "cypher": query}

    def _prove(self, summary: Any, restrict: bool) -> None:
        check_query_type(summary.query_type)
        check_plan(
            summary.plan or {},
            restrict_visibility=restrict,
            database=self.settings.database,
        )

    async def run_cypher(
        self, query: str, params: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        checked = await self.check_cypher(query, params, scope)
        columns, rows = await self.client.read(
            checked["cypher"],
            {**params, **scope.params},
            max_rows=self.settings.max_rows,
            trusted=False,
        )
        return {"columns": columns, "rows": rows}

    async def acl_hidden(self, scope: GraphScope) -> bool:
        """Whether the team holds a ``Doc`` in ``scope``'s visibilities whose access list
        does not admit ``scope.acl_principals`` (one indexed read of at most one row)."""
        _, rows = await self.client.read(ACL_HIDDEN, scope.params, max_rows=1)
        return bool(rows)

    async def _resolve(
        self, ref: dict[str, Any], scope: GraphScope, limit: int = 5
    ) -> list[dict[str, Any]]:
        _, rows = await self.client.read(
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
        _, rows = await self.client.read(
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
        _, entity_rows = await self.client.read(ENTITIES, params, max_rows=max_entities)
        if not entity_rows:
            return {"entities": [], "docs": {}}
        _, rows = await self.client.read(RELATED_DOCS, params, max_rows=max_docs)
        return {
            "entities": [
                {"node": node, "score": round(float(score), 4)} for node, score in entity_rows
            ],
            "docs": {doc_id: float(score) for doc_id, score, _ in rows},
        }

    async def status(self) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            await self.client.run("RETURN 1 AS ok")
        except Exception as exc:
            return {"ready": False, "uri": self.settings.uri, "error": str(exc)}
        return {
            "ready": True,
            "uri": self.settings.uri,
            "latency_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    async def close(self) -> None:
        await self.client.close()
