from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from serve_app.graph.contracts import (
    ExplainPathRequest,
    ExplainPathResponse,
    GraphQueryRequest,
    GraphQueryResponse,
    GraphUpsertRequest,
    GraphUpsertResponse,
)
from serve_app.graph.service import GraphTools
from serve_app.http.deps import Caller, CurrentPrincipal


async def _graph(request: Request) -> GraphTools:
    return request.app.state.services.graph


Graph = Annotated[GraphTools, Depends(_graph)]

router = APIRouter(tags=["graph"])


@router.post("/graph/query", response_model=GraphQueryResponse)
async def graph_query(body: GraphQueryRequest, caller: Caller, graph: Graph) -> GraphQueryResponse:
    """graph.query_context: a named intent with args, or read-only Cypher for roles allowed
    to send it; answers only what lies in the caller's team and visibility."""
    return await graph.graph_query(body, caller)


@router.get("/graph/intents", response_model=None)
async def graph_intents(principal: CurrentPrincipal, graph: Graph) -> dict[str, Any]:
    """The named intents of graph.query_context with their argument schemas."""
    return {"intents": graph.graph_intents()}


@router.post("/graph/explain_path", response_model=ExplainPathResponse)
async def explain_path(
    body: ExplainPathRequest, caller: Caller, graph: Graph
) -> ExplainPathResponse:
    """graph.explain_path: shortest connections between two entities, with a sentence each."""
    return await graph.explain_path(body, caller)


@router.post("/graph/entities", response_model=GraphUpsertResponse)
async def upsert_entities(
    body: GraphUpsertRequest, caller: Caller, graph: Graph
) -> GraphUpsertResponse:
    """MERGE users, agents, resources and their relationships (MEMBER_OF, SERVES, USES, ...)
    into the caller's team; idempotent."""
    return await graph.graph_upsert(body, caller)
