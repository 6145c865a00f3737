"""The FastAPI application, built around a ``GatewayService`` (real or fake)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from serve_app.api import admin, audit, enrich, events, graph, health, ingest, search, tools
from serve_app.auth import Authenticator
from serve_app.errors import install_error_handlers
from serve_app.service import GatewayService
from serve_app.timing import ServerTiming


def create_app(service: GatewayService, authenticator: Authenticator | None = None) -> FastAPI:
    """The app over ``service``; ``authenticator`` defaults to the one ``service.settings``
    configure (every route but /healthz and /readyz needs a principal)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # Shutdown: write every queued audit record before the process goes.
        await asyncio.to_thread(service.audit.close)

    app = FastAPI(
        lifespan=lifespan,
        title="RAG Gateway",
        version="0.1.0",
        description="Tool endpoints for agents over Milvus and Neo4j, tenancy-enforced.",
    )
    app.state.service = service
    app.state.authenticator = authenticator or Authenticator.from_settings(service.settings)
    install_error_handlers(app)
    app.add_middleware(ServerTiming)
    for module in (search, enrich, graph, ingest, events, audit, admin, health, tools):
        app.include_router(module.router)
    return app
