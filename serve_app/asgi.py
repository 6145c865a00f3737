"""The FastAPI application over the gateway's ``Services`` (serve_app/composition.py), real or
over fakes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from serve_app.composition import Services
from serve_app.contracts import ErrorBody
from serve_app.enrich import routes as enrich
from serve_app.graph import routes as graph
from serve_app.http.body_limits import BodyLimits, UrlLimit
from serve_app.http.errors import install_error_handlers
from serve_app.http.tracing import install_tracing
from serve_app.ingest import events_routes as events
from serve_app.ingest import routes as ingest
from serve_app.metrics import RequestMetrics
from serve_app.openapi import install_openapi
from serve_app.ops import audit, health, usage
from serve_app.ops import reindex as admin
from serve_app.ops.surface import catalog_urls, closed_catalog_router
from serve_app.search import routes as search
from serve_app.timing import CountInFlight, InFlight, ServerTiming
from serve_app.tools import routes as tools
from serve_app.tools.mcp import mount_mcp

# The error answers every tool route may give, in the one shape of serve_app/http/errors.py.
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in {
        400: "the graph query does not compile",
        401: "no credential, or one that does not verify",
        403: "the credential does not grant this team, mode or resource",
        404: "a named entity or job does not exist in the caller's scope",
        409: "the request contradicts the current state",
        422: "the request names a field with an impossible value (fields[] says which)",
        429: "a rate limit of the credential or the team is reached (Retry-After says when)",
        503: "a backend the request needs does not answer",
    }.items()
}


def create_app(services: Services, in_flight: InFlight | None = None) -> FastAPI:
    """The app over ``services`` (every route but /healthz and /readyz needs a principal,
    verified by ``services.authenticator``); ``in_flight``, when given, counts the requests
    in progress."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # The MCP server's session manager runs for the app's lifetime (Serve runs this too).
        # So does the worker of background ingestion jobs (serve_app/ingest/worker.py).
        worker = services.ingest.worker
        async with mcp.running(), worker.running() if worker else contextlib.nullcontext():
            yield
        # Shutdown: write every queued audit record before the process goes.
        await asyncio.to_thread(services.recorder.log.close)

    app = FastAPI(
        lifespan=lifespan,
        title="RAG Gateway",
        version="0.1.0",
        description="Tool endpoints for agents over Milvus and Neo4j, tenancy-enforced.",
        **catalog_urls(services.settings),
    )
    # Each feature's routes read their service from here; http/deps.py the shared parts.
    app.state.services = services
    app.state.shared = services.shared
    install_error_handlers(app)
    install_openapi(app, services.settings)
    install_tracing(app)  # trace id headers and log context, around everything
    app.add_middleware(ServerTiming)
    limits = services.settings.http
    app.add_middleware(
        BodyLimits, timeout_s=limits.body_read_timeout_s, max_bytes=limits.max_body_bytes
    )
    app.add_middleware(UrlLimit, max_bytes=limits.max_url_bytes)
    app.add_middleware(RequestMetrics)  # Prometheus, inside a Serve replica only
    if in_flight is not None:
        app.add_middleware(CountInFlight, gauge=in_flight)
    for module in (search, enrich, graph, ingest, events, audit, admin, usage, tools):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    app.include_router(health.router)
    if services.settings.catalog_needs_credential:
        app.include_router(closed_catalog_router(app))
    # The same four tools over MCP (Streamable HTTP) at /mcp, through app.state.services.tools.
    mcp = mount_mcp(app)
    return app
