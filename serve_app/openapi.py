"""The OpenAPI document as the gateway enforces it: the bearer / API-key security every route
but /healthz and /readyz needs, and the configured bounds (``search.max_top_k``,
``neo4j.max_paths``, ``neo4j.max_path_hops``) instead of the models' wider hard ceilings."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serve_app.settings import GatewaySettings

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
        for path, item in doc.get("paths", {}).items():
            for operation in item.values():
                if isinstance(operation, dict) and path not in OPEN_PATHS:
                    operation["security"] = [{"bearer": []}, {"api_key": []}]
        bounds = {
            "SearchDocsRequest": {"top_k": settings.search.max_top_k},
            "ExplainPathRequest": {
                "max_paths": settings.neo4j.max_paths,
                "max_hops": settings.neo4j.max_path_hops,
            },
        }
        models = doc["components"].get("schemas", {})
        for model, fields in bounds.items():
            for name, maximum in fields.items():
                prop = models.get(model, {}).get("properties", {}).get(name)
                if prop is not None:
                    _set_maximum(prop, maximum)
        app.openapi_schema = doc
        return doc

    app.openapi = schema  # type: ignore[method-assign]


def _set_maximum(prop: dict[str, Any], maximum: int) -> None:
    """``maximum`` on an integer property, also inside ``anyOf`` (an optional one)."""
    targets = [p for p in prop.get("anyOf", []) if p.get("type") == "integer"] or [prop]
    for target in targets:
        target["maximum"] = maximum
