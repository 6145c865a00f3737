"""The OpenAPI document as the gateway enforces it: the bearer / API-key security every route
but /healthz and /readyz needs, the configured bounds (``search.max_top_k``,
``search.max_query_chars``, ``enrich.max_draft_chars``, ``ingest.max_documents``,
``ingest.max_document_chars``, ``audit.max_query_limit``, ``neo4j.max_paths``,
``neo4j.max_path_hops``) instead of the models' wider hard ceilings, and one operation per
agent tool (``POST /tools/rag_search_docs``, ...) with that tool's own arguments as its body,
where the route itself is one ``POST /tools/{function}`` taking any JSON object.

The document must not promise more than the server accepts (a request it calls valid is
answered, not refused with 4xx): what a JSON Schema can say is declared (here, in the models
and in ``deployments/validation.py``'s ``SchemaExtra``); what it cannot — one field compared
with another, a key unique across items, Cypher that compiles — is in the descriptions.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from deployments.validation import plain_schema
from serve_app.graph.contracts import query_forms
from serve_app.settings import GatewaySettings
from serve_app.tools.bounds import request_bounds, tighten, tool_bounds
from serve_app.tools.catalog import TOOL_ROUTE, TOOLS, ToolSpec

OPEN_PATHS = ("/healthz", "/readyz")
SECURITY_SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "A JWT of the identity provider, or an API key (rgk_...)",
    },
    "api_key": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}


def install_openapi(app: FastAPI, settings: GatewaySettings) -> None:
    def schema() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        doc.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
        _tool_operations(doc, settings)
        for path, item in doc.get("paths", {}).items():
            for operation in item.values():
                if isinstance(operation, dict) and path not in OPEN_PATHS:
                    operation["security"] = [{"bearer": []}, {"api_key": []}]
        _configured_bounds(doc, settings)
        app.openapi_schema = doc
        return doc

    app.openapi = schema  # type: ignore[method-assign]


def _configured_bounds(doc: dict[str, Any], settings: GatewaySettings) -> None:
    """The limits the services check against settings, on the models' properties."""
    models = doc["components"].get("schemas", {})
    for model, fields in request_bounds(settings).items():
        for name, (keyword, limit) in fields.items():
            prop = models.get(model, {}).get("properties", {}).get(name)
            if prop is not None:
                tighten(prop, keyword, limit)
    # An event's document text, in each payload of the envelope schema.
    events = models.get("IngestEventsRequest", {}).get("properties", {}).get("events", {})
    for form in events.get("items", {}).get("oneOf", []):
        text = form["properties"]["payload"]["properties"].get("text")
        if text is not None:
            tighten(text, "maxLength", settings.ingest.max_document_chars)
    audit = doc["paths"].get("/audit/decisions", {}).get("get", {})
    for parameter in audit.get("parameters", []):
        if parameter.get("name") == "limit":
            tighten(parameter["schema"], "maximum", settings.audit.max_query_limit)
    # The tool operations: the same limits where a tool argument becomes the field.
    for function, fields in tool_bounds(settings).items():
        body = _body_schema(doc, TOOL_ROUTE.format(function=function))
        for name, (keyword, limit) in fields.items():
            prop = body.get("properties", {}).get(name)
            if prop is not None:
                tighten(prop, keyword, limit)


def _body_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    operation = doc["paths"].get(path, {}).get("post", {})
    content = operation.get("requestBody", {}).get("content", {})
    return content.get("application/json", {}).get("schema", {})


def _tool_operations(doc: dict[str, Any], settings: GatewaySettings) -> None:
    """``POST /tools/{function}`` as one operation per tool, each with its arguments' schema
    (the function-calling schema of ``GET /tools``, plus the two forms of graph.query_context,
    which function-calling APIs do not take at the top level)."""
    generic = doc.get("paths", {}).pop(TOOL_ROUTE, {}).get("post")
    if generic is None:
        return
    for spec in TOOLS:
        operation = copy.deepcopy(generic)
        operation["parameters"] = [
            p for p in operation.get("parameters", []) if p.get("name") != "function"
        ]
        if not operation["parameters"]:
            operation.pop("parameters")
        operation["operationId"] = f"call_tool_{spec.function}"
        operation["summary"] = f"Call {spec.name}"
        operation["description"] = (
            f"{spec.description} The arguments an LLM fills (the team and identity come from "
            f"the credential and X-Team-Id); the same as {spec.route} answers. Also served as "
            f"POST /tools/{spec.name}. " + str(generic.get("description", ""))
        )
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _tool_body(spec)}},
        }
        answer = operation.setdefault("responses", {}).setdefault("200", {})
        answer["content"] = {
            "application/json": {"schema": {"type": "object"}},
            "text/plain": {"schema": {"type": "string"}},
        }
        answer["description"] = 'the tool\'s answer; text/plain with "format": "text"'
        doc["paths"][TOOL_ROUTE.format(function=spec.function)] = {"post": operation}


def _tool_body(spec: ToolSpec) -> dict[str, Any]:
    body = plain_schema(spec.args.model_json_schema(by_alias=True))
    if spec.name == "graph.query_context":
        body["oneOf"] = query_forms()
    return body
