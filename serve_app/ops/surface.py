"""The operator surface: the API catalogue (/docs, /redoc, /openapi.json, GET /tools) and
the readiness details, closed whenever authentication is on.

With ``AUTH__MODE=jwt`` or ``ENVIRONMENT=production`` (``SURFACE__CATALOG`` and
``SURFACE__READYZ`` ``auto``, the default; or ``SURFACE__CATALOG=credential``) the catalogue
needs a credential that verifies, like any tool route, and /readyz answers only whether each
component is ready: the model's path, the Milvus and Neo4j URIs, per-replica timings and
backend errors are shown to a caller holding ``surface.details_permission``. Only in
``AUTH__MODE=dev`` (a laptop) are both open by default; ``SURFACE__CATALOG=open`` and
``SURFACE__READYZ=full`` open them explicitly anywhere. /healthz and /readyz's status code
stay open for probes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from serve_app.http.deps import authenticate
from serve_app.http.shared import Shared
from serve_app.settings import GatewaySettings

CATALOG_ACTION = "catalog.read"


async def catalog_access(request: Request) -> None:
    """Route dependency: a verified credential when the catalogue is closed (else nothing)."""
    shared: Shared = request.app.state.shared
    if shared.settings.catalog_needs_credential:
        await authenticate(request, CATALOG_ACTION)


def catalog_urls(settings: GatewaySettings) -> dict[str, Any]:
    """FastAPI's own (open) catalogue routes, switched off when ``closed_catalog_router``
    serves them behind a credential instead."""
    if settings.catalog_needs_credential:
        return {"openapi_url": None, "docs_url": None, "redoc_url": None}
    return {}


def closed_catalog_router(app: FastAPI) -> APIRouter:
    """/openapi.json, /docs and /redoc behind ``catalog_access``. The pages load the schema
    from the browser, which sends no bearer token by itself: fetch /openapi.json with the
    credential instead (curl, an API client) when the UI cannot."""
    router = APIRouter(dependencies=[Depends(catalog_access)], include_in_schema=False)

    @router.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @router.get("/docs")
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")

    return router


async def readiness_view(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as this caller may see it: whole when details are open or the caller holds
    the details permission, else each component's ``ready`` flag only."""
    shared: Shared = request.app.state.shared
    settings = shared.settings
    if settings.readyz_details_open:
        return body
    if shared.authenticator.credential(request.headers):
        principal = await authenticate(request, "readyz.details")
        if settings.surface.details_permission in principal.permissions:
            return body
    view = {
        **body,
        "components": {
            name: {"ready": bool(part.get("ready"))}
            for name, part in body.get("components", {}).items()
        },
    }
    view["details"] = (
        f"component details need a credential with {settings.surface.details_permission!r}"
    )
    return view
