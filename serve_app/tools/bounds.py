"""The limits the server enforces from its settings, as JSON Schema upper bounds: every listing
of the tools (``GET /tools`` in each format, the MCP tool list, the OpenAPI document) states
these instead of the argument models' wider hard ceilings, so a caller that obeys a schema is
never refused for a length or a count (issue 38, item 1)."""

from __future__ import annotations

from typing import Any

from serve_app.settings import GatewaySettings

# model or tool function -> field -> (JSON Schema keyword, the configured limit)
Bounds = dict[str, dict[str, tuple[str, int]]]


def tool_bounds(settings: GatewaySettings) -> Bounds:
    """Per tool function: the argument bounds the services check against ``settings``."""
    search, enrich, neo4j = settings.search, settings.enrich, settings.neo4j
    return {
        "rag_search_docs": {
            "query": ("maxLength", search.max_query_chars),
            "top_k": ("maximum", search.max_top_k),
        },
        "rag_enrich_answer": {"draft_answer": ("maxLength", enrich.max_draft_chars)},
        "graph_explain_path": {
            "max_paths": ("maximum", neo4j.max_paths),
            "max_hops": ("maximum", neo4j.max_path_hops),
        },
    }


def request_bounds(settings: GatewaySettings) -> Bounds:
    """Per request model (the full HTTP routes): the same limits on the model's fields."""
    search, enrich, ingest, neo4j = (
        settings.search,
        settings.enrich,
        settings.ingest,
        settings.neo4j,
    )
    return {
        "SearchDocsRequest": {
            "top_k": ("maximum", search.max_top_k),
            "query": ("maxLength", search.max_query_chars),
        },
        "EnrichAnswerRequest": {"draft_answer": ("maxLength", enrich.max_draft_chars)},
        "ExplainPathRequest": {
            "max_paths": ("maximum", neo4j.max_paths),
            "max_hops": ("maximum", neo4j.max_path_hops),
        },
        "IngestDocumentsRequest": {"documents": ("maxItems", ingest.max_documents)},
        "SourceDocument": {"text": ("maxLength", ingest.max_document_chars)},
        "IngestEventsRequest": {"events": ("maxItems", ingest.max_documents)},
    }


def tighten(prop: dict[str, Any], keyword: str, limit: int) -> None:
    """``keyword`` (an upper bound) of ``prop`` at most ``limit``, also inside ``anyOf`` (an
    optional field): the schema's own bound stays where it is lower."""
    targets = [p for p in prop.get("anyOf", []) if p.get("type") not in (None, "null")] or [prop]
    for target in targets:
        target[keyword] = min(limit, target.get(keyword, limit))


def apply(schema: dict[str, Any], fields: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """``schema`` (an object schema) with ``fields``' bounds on its properties."""
    for name, (keyword, limit) in fields.items():
        prop = schema.get("properties", {}).get(name)
        if prop is not None:
            tighten(prop, keyword, limit)
    return schema
