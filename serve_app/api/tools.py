"""``GET /tools``: the agent tools this gateway serves, with JSON schemas for a router's tool
configuration (DAGI Router and the like). Schemas only: no tenant data, no credential needed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from serve_app.contracts import (
    EnrichAnswerRequest,
    EnrichAnswerResponse,
    SearchDocsRequest,
    SearchDocsResponse,
)
from serve_app.graph_contracts import (
    ExplainPathRequest,
    ExplainPathResponse,
    GraphQueryRequest,
    GraphQueryResponse,
)

router = APIRouter(tags=["ops"])

TOOLS = (
    (
        "rag.search_docs",
        "POST /rag/search_docs",
        "Hybrid (dense + BM25, optionally graph-scoped) search of the team's documents; "
        "matches with score, title, snippet and source_ref.",
        SearchDocsRequest,
        SearchDocsResponse,
    ),
    (
        "rag.enrich_answer",
        "POST /rag/enrich_answer",
        "Citations for a draft answer from the team's documents, and the claims they do "
        "not support.",
        EnrichAnswerRequest,
        EnrichAnswerResponse,
    ),
    (
        "graph.query_context",
        "POST /graph/query",
        "Relationship questions over the team's knowledge graph: a named intent with args "
        "(GET /graph/intents), or read-only Cypher for roles allowed to send it.",
        GraphQueryRequest,
        GraphQueryResponse,
    ),
    (
        "graph.explain_path",
        "POST /graph/explain_path",
        "How two entities are connected inside the caller's scope, with a sentence per path.",
        ExplainPathRequest,
        ExplainPathResponse,
    ),
)


@router.get("/tools")
async def tools() -> dict[str, Any]:
    """The four tools with their input and output JSON schemas."""
    return {
        "tools": [
            {
                "name": name,
                "endpoint": endpoint,
                "description": description,
                "input_schema": request.model_json_schema(),
                "output_schema": response.model_json_schema(),
                "auth": "Authorization: Bearer <JWT or API key>",
            }
            for name, endpoint, description, request, response in TOOLS
        ]
    }
