"""graph.query_context, graph.explain_path and the entity upsert: the graph tools' service.

Every call builds its AccessContext first (403 before anything runs), passes the graph store
only ``graph_access.graph_scope(ctx)`` for the tenant and visibility parameters, filters
every returned row again with ``graph_access.may_see_value`` and audits the decision. Neo4j
down answers 503 here while document search keeps working.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from deployments.errors import BackendUnavailable, InvalidInput, NotFound
from deployments.graph_store.intents import INTENTS, catalogue
from deployments.graph_store.store import entity_not_found
from deployments.protocols import GraphStore
from serve_app.access import graph as graph_access
from serve_app.access.context import AccessContext
from serve_app.access.policy import Policy
from serve_app.audit.log import request_audit
from serve_app.audit.recorder import AuditRecorder
from serve_app.auth.principal import Principal
from serve_app.graph.contracts import (
    ExplainPathRequest,
    ExplainPathResponse,
    GraphQueryRequest,
    GraphQueryResponse,
    GraphUpsertRequest,
    GraphUpsertResponse,
    PathOut,
)
from serve_app.graph.text import path_sentence
from serve_app.request import RequestContext
from serve_app.settings import GatewaySettings


class GraphTools:
    """The graph tools over ``graph`` (``None``: the graph is not deployed, every call is
    503), audited through ``recorder``."""

    def __init__(
        self,
        settings: GatewaySettings,
        graph: GraphStore | None,
        policy: Policy,
        recorder: AuditRecorder,
    ) -> None:
        self.settings = settings
        self.graph = graph
        self.policy = policy
        self.recorder = recorder
        # Called with the team after an entity upsert (the service raises its generation).
        self.on_write: Callable[[str], Awaitable[None]] | None = None

    def _graph_store(self) -> GraphStore:
        if self.graph is None:
            raise BackendUnavailable(
                "neo4j",
                "the graph is disabled in this deployment (graph_enabled: false)",
                hint="document search still works: POST /rag/search_docs",
            )
        return self.graph

    async def _audited(
        self,
        audit: dict,
        rc: RequestContext,
        run: Callable[[float], Awaitable[tuple[Any, dict[str, Any]]]],
    ) -> Any:
        with self.recorder.audited(rc, audit) as allowed:
            response, allowed.fields = await run(rc.started)
        return response

    def _context(self, principal: Principal, req: Any) -> AccessContext:
        return AccessContext.for_caller(
            principal,
            self.policy,
            team_id=req.team_id,
            user_id=req.user_id,
            agent_id=req.agent_id,
            visibility=req.visibility,
        )

    # --- graph.query_context ---------------------------------------------------------------
    def graph_intents(self) -> list[dict[str, Any]]:
        return catalogue()

    async def graph_query(self, req: GraphQueryRequest, rc: RequestContext) -> GraphQueryResponse:
        """Run a named intent or a caller's Cypher inside the caller's scope.

        Raises:
            Forbidden: team/mode not granted, Cypher from a role without ``cypher_roles`` or
                from a caller some policy or document ACL hides something of the team from,
                or Cypher that is not provably read-only and scoped.
            InvalidInput / NotFound: bad intent args / unknown intent (4xx naming them).
            InvalidQuery, QueryLimitExceeded: Neo4j's compile error; timeout or row limit.
            BackendUnavailable: Neo4j is down (503).
        """
        resource = f"team:{req.team_id}/" + (f"intent:{req.intent}" if req.intent else "cypher")
        audit = request_audit(req, rc.principal, "graph.query", resource, req.cypher)

        async def run(started: float) -> tuple[GraphQueryResponse, dict]:
            ctx = self._context(rc.principal, req)
            intent_name: str | None = None
            if req.intent:
                intent = INTENTS.get(req.intent.upper())
                if intent is None:
                    raise NotFound(
                        f"unknown intent {req.intent!r}; known: {', '.join(INTENTS)}",
                        field="intent",
                        hint="GET /graph/intents lists them with their argument schemas",
                    )
                try:
                    args = intent.args.model_validate(req.args).model_dump()
                except ValidationError as exc:
                    problems = "; ".join(
                        f"args.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
                    )
                    raise InvalidInput(
                        f"bad args for {intent.name}: {problems}",
                        field="args",
                        hint=f"schema: {intent.args.model_json_schema().get('properties')}",
                    ) from None
                intent_name = intent.name
                result = await self._graph_store().run_intent(
                    intent_name, args, graph_access.graph_scope(ctx)
                )
            else:
                graph_access.check_cypher(ctx)
                graph_access.check_cypher_names(req.cypher or "")
                await graph_access.check_cypher_acl(ctx, self._graph_store())
                result = await self._graph_store().run_cypher(
                    req.cypher or "", req.params, graph_access.graph_scope(ctx)
                )
            columns = result["columns"]
            kept, filtered = [], 0
            for row in result["rows"]:
                if graph_access.may_see_value(ctx, row):
                    row = graph_access.without_access_properties(row)
                    kept.append(dict(zip(columns, row, strict=True)))
                else:
                    filtered += 1
            response = GraphQueryResponse(
                intent=intent_name,
                columns=columns,
                rows=kept,
                filtered_rows=filtered,
                took_ms=round((time.perf_counter() - started) * 1000, 1),
                trace_id=rc.trace_id,
            )
            return response, {"doc_ids": _doc_ids(kept)}

        return await self._audited(audit, rc, run)

    # --- graph.explain_path ----------------------------------------------------------------
    async def explain_path(
        self, req: ExplainPathRequest, rc: RequestContext
    ) -> ExplainPathResponse:
        """Shortest paths between two entities, every node and relationship in scope."""
        cfg = self.settings.neo4j
        audit = request_audit(req, rc.principal, "graph.explain_path", f"team:{req.team_id}/path")
        audit["query_text"] = f"{req.source.ref} -> {req.target.ref}"

        async def run(started: float) -> tuple[ExplainPathResponse, dict]:
            ctx = self._context(rc.principal, req)
            if req.max_hops > cfg.max_path_hops:
                raise InvalidInput(
                    f"max_hops must be at most {cfg.max_path_hops}", field="max_hops"
                )
            if req.max_paths > cfg.max_paths:
                raise InvalidInput(f"max_paths must be at most {cfg.max_paths}", field="max_paths")
            result = await self._graph_store().explain_path(
                req.source.model_dump(),
                req.target.model_dump(),
                graph_access.graph_scope(ctx),
                req.max_hops,
                req.max_paths,
            )
            sources = [n for n in result["source"] if graph_access.may_see_entity(ctx, n)]
            targets = [n for n in result["target"] if graph_access.may_see_entity(ctx, n)]
            for side, found, ref in (("from", sources, req.source), ("to", targets, req.target)):
                if not found:
                    raise entity_not_found(side, ref.model_dump(), req.team_id)
            paths, filtered = [], 0
            for path in result["paths"]:
                if not graph_access.may_see_value(ctx, path):
                    filtered += 1
                    continue
                path = graph_access.without_access_properties(path)
                paths.append(
                    PathOut(
                        length=len(path["relationships"]),
                        sentence=path_sentence(path),
                        nodes=path["nodes"],
                        relationships=path["relationships"],
                    )
                )
            if paths:
                explanation = " ".join(
                    f"Path {i + 1}: {p.sentence}" if len(paths) > 1 else p.sentence
                    for i, p in enumerate(paths)
                )
            else:
                explanation = (
                    f"No connection of at most {req.max_hops} relationships between "
                    f"{req.source.ref!r} and {req.target.ref!r} within your scope."
                )
            response = ExplainPathResponse(
                explanation=explanation,
                paths=paths,
                source=graph_access.without_access_properties(sources),
                target=graph_access.without_access_properties(targets),
                filtered_paths=filtered,
                took_ms=round((time.perf_counter() - started) * 1000, 1),
                trace_id=rc.trace_id,
            )
            return response, {}

        return await self._audited(audit, rc, run)

    # --- entity upsert ---------------------------------------------------------------------
    async def graph_upsert(
        self, req: GraphUpsertRequest, rc: RequestContext
    ) -> GraphUpsertResponse:
        """MERGE entities and relationships into the caller's team (write roles only)."""
        audit = request_audit(req, rc.principal, "graph.upsert", f"team:{req.team_id}/entities")

        async def run(started: float) -> tuple[GraphUpsertResponse, dict]:
            ctx = self._context(rc.principal, req)
            graph_access.check_graph_write(
                ctx, [n.visibility for n in req.nodes] + [r.visibility for r in req.relationships]
            )
            nodes = [n.model_dump() for n in req.nodes]
            rels = [
                {
                    "type": r.type,
                    "from_label": r.source.label,
                    "from_id": r.source.id,
                    "to_label": r.target.label,
                    "to_id": r.target.id,
                    "visibility": r.visibility,
                    "properties": r.properties,
                }
                for r in req.relationships
            ]
            merged = await self._graph_store().upsert_entities(
                req.team_id, nodes, rels, graph_access.graph_scope(ctx)
            )
            if merged["refused"]:
                raise graph_access.out_of_reach(ctx, merged["refused"])
            for change in merged["changes"]:
                self._audit_visibility_change(rc, req.team_id, change)
            if self.on_write is not None:  # graph-boosted answers of the team may change
                await self.on_write(req.team_id)
            response = GraphUpsertResponse(
                nodes=merged["nodes"],
                relationships=merged["relationships"],
                visibility_changes=merged["changes"],
                derived_ends=merged["derived_ends"],
                took_ms=round((time.perf_counter() - started) * 1000, 1),
                trace_id=rc.trace_id,
            )
            return response, {}

        return await self._audited(audit, rc, run)

    def _audit_visibility_change(
        self, rc: RequestContext, team_id: str, change: dict[str, Any]
    ) -> None:
        """One ``graph.visibility`` record per node or relationship whose visibility a
        write changed: every such change is an explicit, audited act."""
        if "type" in change:
            what = f"rel:{change['type']}:{change['from_id']}->{change['to_id']}"
        else:
            what = f"entity:{change['label']}:{change['id']}"
        before = "derived" if change.get("was_derived") else change.get("before")
        self.recorder.decision(
            rc.trace_id,
            rc.principal,
            action="graph.visibility",
            decision="allow",
            reason=f"visibility:{before}->{change['after']}",
            http_status=200,
            team_id=team_id,
            resource=f"team:{team_id}/{what}",
        )


def _doc_ids(rows: list[dict[str, Any]]) -> list[str]:
    """Ids of the documents a graph answer showed, for the audit record."""
    found: dict[str, None] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("_type") == "node" and "Doc" in (value.get("labels") or ()):
                found.setdefault(str(value.get("id")), None)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(rows)
    return list(found)[:200]
