"""The MCP face of the four agent tools (serve_app/tools/catalog.py), mounted in the ingress at
``/mcp``: the official SDK's low-level ``Server`` over Streamable HTTP, stateless with JSON
responses (no session state, so any ingress replica answers any request).

Every HTTP request to ``/mcp`` is authenticated first, like every route (a missing or bad
credential is a 401 with the gateway's error body, audited as action ``mcp``); the verified
principal rides in the ASGI scope to the tool handler, which builds the request context of
every route from it and the call's HTTP request (trace id, X-Agent-Id, the tenancy headers) and
calls ``app.state.services.tools`` (``ToolRunner``): the policy, the audit records and the
errors are those of ``POST /tools/{function}``. A ``GatewayError`` is a tool error
(``isError``) whose text is the gateway's JSON error body, so the agent sees it; anything
unexpected is a tool error ``internal_error`` without its traceback (which goes to the log).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import mcp_types as types
from fastapi import FastAPI
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from deployments.errors import BackendUnavailable, GatewayError, Unauthorized
from serve_app.auth import Principal
from serve_app.http.deps import authenticate, rate_limit, request_context
from serve_app.http.errors import error_content, trace_id_of
from serve_app.tools.catalog import mcp_tools
from serve_app.tools.runner import ToolRunner

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
# OAuth 2.0 Protected Resource Metadata (RFC 9728) of /mcp, as the MCP authorization spec
# asks a server to publish: the well-known path with the resource's path appended.
METADATA_PATH = "/.well-known/oauth-protected-resource"
AUDIT_ACTION = "mcp"
# The ASGI scope key the authenticating wrapper stores the verified principal under.
PRINCIPAL_KEY = "rag_gateway.principal"
INSTRUCTIONS = (
    "Tools over the team's documents (Milvus) and knowledge graph (Neo4j). The team comes from "
    "the credential or the X-Team-Id header, never from the arguments; a tool error's text is "
    "the gateway's JSON error body (error, message, hint, reason, fields)."
)


def error_body(exc: GatewayError, trace_id: str) -> dict[str, Any]:
    """The JSON error body of serve_app/http/errors.py, with the HTTP status it would have."""
    return {**error_content(exc, trace_id), "status": exc.status_code}


def _text(value: Any) -> types.TextContent:
    return types.TextContent(text=json.dumps(value, ensure_ascii=False))


def _tool_error(body: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[_text(body)], is_error=True)


def build_server(app: FastAPI) -> Server[Any]:
    """The MCP server of the catalog's tools, each call run by ``app.state.services.tools``."""
    settings = app.state.shared.settings
    listing = types.ListToolsResult(
        tools=[types.Tool.model_validate(t) for t in mcp_tools(settings)]
    )
    schemas = {t.name: t.input_schema for t in listing.tools}

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        # The HTTP request of this call (the SDK's transport attaches it), as the wrapper saw it.
        request = ctx.request if isinstance(ctx.request, Request) else None
        principal = request.scope.get(PRINCIPAL_KEY) if request is not None else None
        trace_id = trace_id_of(request) if request is not None else uuid.uuid4().hex
        try:
            if request is None or not isinstance(principal, Principal):  # fail closed
                raise Unauthorized("the MCP call carries no verified caller", error=None)
            # The Caller of every route (trace id, principal, routed agent), built the same way.
            rc = await request_context(request, principal)
            runner: ToolRunner = app.state.services.tools
            result = await runner.call(params.name, params.arguments, rc, request.headers)
        except GatewayError as exc:
            return _tool_error(error_body(exc, trace_id))
        except Exception as exc:
            logger.exception("MCP tool %s failed unexpectedly (trace %s)", params.name, trace_id)
            return _tool_error(
                {
                    "error": "internal_error",
                    "message": type(exc).__name__,
                    "status": 500,
                    "trace_id": trace_id,
                }
            )
        data = result.response.model_dump(mode="json", exclude_none=True, by_alias=True)
        text = types.TextContent(text=result.text) if result.text is not None else _text(data)
        return types.CallToolResult(content=[text], structured_content=data)

    return Server(
        "rag-gateway",
        version=app.version,
        title=app.title,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # The Mcp-Param header check of 2026-07-28 reads the schema here, not via tools/list.
        get_tool_input_schema=schemas.get,
    )


class McpEndpoint:
    """The ASGI app at /mcp: authenticates, then hands the request to the SDK's session
    manager, which ``running()`` (the FastAPI lifespan) creates, starts and stops."""

    # The metrics' endpoint label (serve_app/metrics.py, ``endpoint_of``).
    route_path = MCP_PATH

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.server = build_server(app)
        self.manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        # A manager runs once: each lifespan (tests start an app more than once) gets its own.
        manager = StreamableHTTPSessionManager(
            app=self.server,
            json_response=True,
            stateless=True,
            # No DNS-rebinding check: callers send a bearer credential (never cookies), and the
            # Host seen behind Serve's proxy is whatever the deployment is reached as.
            security_settings=None,
        )
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        trace_id = trace_id_of(request)  # traceparent, X-Trace-Id or a new one (http/errors.py)
        try:
            principal = await authenticate(request, AUDIT_ACTION)
            await rate_limit(request, principal, AUDIT_ACTION)
            if self.manager is None:
                raise BackendUnavailable("mcp", "the MCP server is not running (no app lifespan)")
        except GatewayError as exc:
            if isinstance(exc, Unauthorized):  # tell an OAuth client where to start
                exc.resource_metadata = _base_url(request) + METADATA_PATH + MCP_PATH
            response = JSONResponse(
                error_body(exc, trace_id), status_code=exc.status_code, headers=exc.headers or None
            )
            await response(scope, receive, send)
            return
        scope[PRINCIPAL_KEY] = principal
        await self.manager.handle_request(scope, receive, send)


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def protected_resource_metadata(request: Request) -> JSONResponse:
    """RFC 9728 metadata of /mcp: the resource, the authorization server whose tokens it
    takes (``auth.issuer``; none in dev mode, where no token is needed) and how a token is
    sent. Public, like any discovery document. ``jwks_uri`` is left out on purpose: in
    RFC 9728 it names the resource's own signing keys, and the gateway signs nothing; the
    issuer's keys are found through the issuer's own metadata."""
    auth = request.app.state.shared.settings.auth
    issuers = [auth.issuer] if auth.mode == "jwt" and auth.issuer else []
    return JSONResponse(
        {
            "resource": _base_url(request) + MCP_PATH,
            "authorization_servers": issuers,
            "bearer_methods_supported": ["header"],
            "resource_name": "RAG Gateway (MCP)",
        },
        headers={"Cache-Control": "max-age=3600"},
    )


def mount_mcp(app: FastAPI) -> McpEndpoint:
    """Mount the MCP server at /mcp (and its RFC 9728 metadata at the well-known paths);
    the app's lifespan must enter ``.running()``."""
    endpoint = McpEndpoint(app)
    for path in (METADATA_PATH + MCP_PATH, METADATA_PATH):
        app.add_route(path, protected_resource_metadata, methods=["GET"], include_in_schema=False)
    # An ASGI app as the endpoint: Starlette calls it with (scope, receive, send) as is.
    # POST only: the server is stateless, so a GET would open an event stream that never
    # carries anything and holds a request until the proxy's timeout; the transport spec's
    # answer for a server that offers none is 405 (the gateway's error shape, Allow: POST).
    app.add_route(MCP_PATH, cast(Any, endpoint), methods=["POST"], include_in_schema=False)
    return endpoint
