"""The FastAPI application, built around a ``GatewayService`` (real or fake)."""

from __future__ import annotations

from fastapi import FastAPI

from serve_app.api import health, ingest, search
from serve_app.errors import install_error_handlers
from serve_app.service import GatewayService


def create_app(service: GatewayService) -> FastAPI:
    app = FastAPI(
        title="RAG Gateway",
        version="0.1.0",
        description="Tool endpoints for agents over Milvus and Neo4j, tenancy-enforced.",
    )
    app.state.service = service
    install_error_handlers(app)
    for module in (search, ingest, health):
        app.include_router(module.router)
    return app
