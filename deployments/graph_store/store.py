"""Knowledge graph over Neo4j: ``Neo4jGraph`` (idempotent MERGE of ingested documents and
entities, guarded caller Cypher, intents, paths and related documents). Every node and
relationship carries ``team_id`` and ``visibility``; Neo4j Community has one user database,
so tenancy lives in these properties. Beside it: client.py (the driver, transactions,
error mapping), values.py (driver values → JSON), cypher.py (the statements),
intents.py, guard.py, scope.py; the Serve shell is deployment.py."""

from __future__ import annotations

import logging
import time
from typing import Any

from deployments import acl
from deployments.config import Neo4jSettings
from deployments.errors import BackendUnavailable, Forbidden, InvalidInput, InvalidQuery, NotFound
from deployments.graph_store.client import Neo4jClient, tx_rows
from deployments.graph_store.cypher import (
    ACL_HIDDEN,
    DELETE_DOCUMENTS,
    ENTITIES,
    MERGE_DOCUMENTS,
    NODE_LABELS,
    RECOMPUTE_DERIVED,
    RELATED_DOCS,
    RELATIONSHIPS,
    RESOLVE,
    lucene_terms,
    merge_nodes,
    merge_relationships,
    shortest_paths,
    writable_nodes,
    writable_relationships,
)
from deployments.graph_store.guard import CypherRejected, check_plan, check_query_type
from deployments.graph_store.intents import INTENTS
from deployments.graph_store.scope import scope_query
from deployments.graph_store.values import node_label
from deployments.protocols import GraphDocument, GraphScope

logger = logging.getLogger(__name__)
# An intent slower than this is logged with its name (its plan, Neo4j's load, its data).
SLOW_INTENT_S = 1.0


def document_row(d: GraphDocument) -> dict[str, Any]:
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


def entity_not_found(side: str, ref: dict[str, Any], team_id: str) -> NotFound:
    """explain_path's answer for an end that names nothing the caller may see: the same
    whether the entity does not exist or is outside the caller's scope."""
    label = f" with label {ref['label']}" if ref.get("label") else ""
    return NotFound(
        f"no entity {ref['ref']!r}{label} in team {team_id!r} within your visibility",
        field=side,
        hint="name an entity by its id, name or title (GET /graph/intents: "
        "ENTITY_NEIGHBOURS helps to explore)",
    )


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
        ``Doc`` gets its current access list, and the entities the documents made (before
        and after) their visibility from their documents, in the same transaction. Returns
        how many were merged."""
        if not docs:
            return 0
        return await self._with_recompute(
            MERGE_DOCUMENTS, {"docs": [document_row(d) for d in docs]}
        )

    async def delete_documents(self, team_id: str, doc_ids: list[str]) -> int:
        """Remove the team's ``Doc`` nodes of ``doc_ids`` with their relationships; the
        entities they made keep existing while another document names them (their
        visibility derived again) and go with the last one; wiki-links from other notes
        move to a placeholder of the deleted note."""
        if not doc_ids:
            return 0
        return await self._with_recompute(
            DELETE_DOCUMENTS, {"team_id": team_id, "ids": list(doc_ids)}
        )

    async def _with_recompute(self, statement: str, params: dict[str, Any]) -> int:
        """``statement`` (it returns a count and the ``affected`` derived nodes), then
        ``RECOMPUTE_DERIVED`` over those, in one write transaction; returns the count."""

        async def work(tx: Any) -> int:
            rows = await tx_rows(tx, statement, params)
            if not rows:
                return 0
            if rows[0]["affected"]:
                await tx_rows(tx, RECOMPUTE_DERIVED, {"affected": rows[0]["affected"]})
            count = rows[0].get("merged", rows[0].get("deleted"))
            return int(count or 0)

        return await self.client.write_transaction(work)

    async def upsert_entities(
        self,
        team_id: str,
        nodes: list[dict[str, Any]],
        relationships: list[dict[str, Any]],
        scope: GraphScope,
    ) -> dict[str, Any]:
        """MERGE entities and relationships of one team (validated by the caller: labels and
        types from the vocabulary, no reserved property names) in one transaction, unless
        it would touch what the writer's ``scope`` does not hold: an existing node outside
        it (visibility, policies, or made by documents none of which it may see) or an
        existing relationship of another visibility. Then nothing is written and
        ``refused`` names them. Relationship ends that do not exist yet are created with the
        relationship's visibility; existing ends are never changed.

        Returns:
            ``nodes``, ``relationships`` (how many merged), ``refused``, ``changes`` (the
            visibility changes made, for the audit log) and ``derived_ends`` (relationship
            ends documents made: they go when their documents go).
        """
        # Documents and their edges are ingestion's: intents rely on every edge at a Doc
        # having been written from that (real) document (graph_intents.DOCUMENT_EDGES).
        writable = set(NODE_LABELS) - {"Doc"}
        node_groups: dict[str, list[dict[str, Any]]] = {}
        for node in nodes:
            if node["label"] not in writable:
                raise InvalidInput(f"label {node['label']!r} cannot be written here")
            node_groups.setdefault(node["label"], []).append(node)
        rel_groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for rel in relationships:
            key = (rel["type"], rel["from_label"], rel["to_label"])
            if rel["type"] not in RELATIONSHIPS or {key[1], key[2]} - writable:
                raise InvalidInput(
                    f"relationship {rel['type']} {key[1]}->{key[2]} cannot be written here"
                )
            rel_groups.setdefault(key, []).append(rel)
        named: dict[str, set[str]] = {}
        for label, group in node_groups.items():
            named.setdefault(label, set()).update(n["id"] for n in group)
        for rel in relationships:
            named.setdefault(rel["from_label"], set()).add(rel["from_id"])
            named.setdefault(rel["to_label"], set()).add(rel["to_id"])
        params = {**scope.params, "team_id": team_id}

        async def work(tx: Any) -> dict[str, Any]:
            out: dict[str, Any] = {
                "nodes": 0,
                "relationships": 0,
                "refused": [],
                "changes": [],
                "derived_ends": [],
            }
            rel_ends = {(r["from_label"], r["from_id"]) for r in relationships} | {
                (r["to_label"], r["to_id"]) for r in relationships
            }
            for label, ids in sorted(named.items()):
                for row in await tx_rows(tx, writable_nodes(label), {**params, "ids": sorted(ids)}):
                    if not row["writable"]:
                        out["refused"].append({"label": label, "id": row["id"]})
                    elif row["derived"] and (label, row["id"]) in rel_ends:
                        out["derived_ends"].append({"label": label, "id": row["id"]})
            for (rtype, a, b), group in rel_groups.items():
                for row in await tx_rows(
                    tx, writable_relationships(rtype, a, b), {**params, "rels": group}
                ):
                    out["refused"].append(
                        {"type": rtype, "from_id": row["from_id"], "to_id": row["to_id"]}
                    )
            if out["refused"]:
                return out
            for label, group in node_groups.items():
                rows = await tx_rows(tx, merge_nodes(label), {"team_id": team_id, "nodes": group})
                out["nodes"] += int(rows[0]["c"]) if rows else 0
                for change in rows[0]["changes"] if rows else ():
                    out["changes"].append({"label": label, **change})
            for (rtype, a, b), group in rel_groups.items():
                rows = await tx_rows(
                    tx, merge_relationships(rtype, a, b), {"team_id": team_id, "rels": group}
                )
                out["relationships"] += int(rows[0]["c"]) if rows else 0
                for change in rows[0]["changes"] if rows else ():
                    out["changes"].append({"type": rtype, **change})
            return out

        return await self.client.write_transaction(work)

    async def run_intent(
        self, name: str, args: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        intent = INTENTS[name]
        started = time.perf_counter()
        try:
            columns, rows = await self.client.read_own(
                intent.cypher, {**args, **scope.params}, max_rows=self.settings.max_rows
            )
        except BackendUnavailable as exc:
            logger.warning(
                "graph: intent %s failed after %.1f s: %s",
                name,
                time.perf_counter() - started,
                exc,
            )
            raise
        took = time.perf_counter() - started
        if took > SLOW_INTENT_S:
            logger.warning("graph: intent %s took %.1f s (%d rows)", name, took, len(rows))
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
        _, rows = await self.client.read_own(ACL_HIDDEN, scope.params, max_rows=1)
        return bool(rows)

    async def _resolve(
        self, ref: dict[str, Any], scope: GraphScope, limit: int = 5
    ) -> list[dict[str, Any]]:
        _, rows = await self.client.read_own(
            RESOLVE,
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
                raise entity_not_found(side, ref, scope.team_id)
            ends.append(found)
        hops = max(1, min(int(max_hops), self.settings.max_path_hops))
        _, rows = await self.client.read_own(
            shortest_paths(hops),
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
        _, entity_rows = await self.client.read_own(ENTITIES, params, max_rows=max_entities)
        if not entity_rows:
            return {"entities": [], "docs": {}}
        _, rows = await self.client.read_own(RELATED_DOCS, params, max_rows=max_docs)
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
