"""Maps the one exception tree (deployments.errors) and FastAPI validation errors to JSON
bodies that say what was wrong and what to send instead."""

from __future__ import annotations

import logging
import types
import typing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.errors import (
    BackendUnavailable,
    Forbidden,
    GatewayError,
    InvalidInput,
    Unauthorized,
)
from deployments.tracing import new_trace_id, single_traceparent

logger = logging.getLogger(__name__)

__all__ = [
    "BackendUnavailable",
    "Forbidden",
    "GatewayError",
    "InvalidInput",
    "Unauthorized",
    "install_error_handlers",
    "trace_id_of",
]


# Starlette's own HTTP errors → (error code, hint).
HTTP_CODES: dict[int, tuple[str, str | None]] = {
    400: ("bad_request", None),
    404: ("not_found", "GET /docs lists the routes; the agent tools are under /tools"),
    405: ("method_not_allowed", "GET /docs lists each route's method"),
    408: ("request_timeout", "send the whole body promptly (http.body_read_timeout_s)"),
    413: ("payload_too_large", "split the request (http.max_body_bytes)"),
    414: (
        "uri_too_long",
        "send long inputs in the JSON body of a POST; a URL may be http.max_url_bytes long",
    ),
}


MAX_TRACE_ID = 128


def error_content(exc: GatewayError, trace_id: str) -> dict[str, Any]:
    """The JSON body of a gateway error: every HTTP answer's and every MCP tool error's."""
    content: dict[str, Any] = {
        "error": exc.code,
        "message": exc.message,
        "hint": exc.hint,
        "trace_id": trace_id,
    }
    if exc.reason:
        content["reason"] = exc.reason
    if exc.fields:
        content["fields"] = exc.fields
    elif exc.field:
        content["fields"] = [{"field": exc.field, "problem": exc.message}]
    return content


def trace_id_of(request: Request) -> str:
    """The request's trace id (decided once, kept on ``request.state``): the trace id of a
    valid W3C ``traceparent`` header (one header; two are invalid, as the W3C rules say),
    else the ``X-Trace-Id`` header, else a new uuid4 hex."""
    existing = getattr(request.state, "trace_id", None)
    if existing:
        return existing
    parent = single_traceparent(request.headers.getlist("traceparent"))
    given = request.headers.get("x-trace-id", "")
    # A caller's id is kept when it fits the audit column (128 printable ASCII characters).
    if not (0 < len(given) <= MAX_TRACE_ID and given.isascii() and given.isprintable()):
        given = ""
    trace = parent.trace_id if parent else given or new_trace_id()
    request.state.trace_id = trace
    return trace


def _field_path(loc: tuple) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def _submodel(annotation: typing.Any) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (through Optional, list, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (
        typing.Union,
        types.UnionType,
        list,
        tuple,
        typing.Annotated,
    ):
        for arg in typing.get_args(annotation):
            found = _submodel(arg)
            if found is not None:
                return found
    return None


def allowed_keys(request: Request, loc: tuple) -> list[str] | None:
    """For an unknown key at ``loc``: the keys the model at that place accepts."""
    endpoint = getattr(request.scope.get("route"), "endpoint", None)
    if endpoint is None:
        return None
    try:
        model = _submodel(typing.get_type_hints(endpoint, include_extras=True).get("body"))
    except Exception:  # unresolvable annotations: no list, the error stays clear without it
        return None
    for part in loc[1:-1] if loc and loc[0] == "body" else loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(str(part)) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        model = _submodel(field.annotation) if field is not None else None
    if model is None:
        return None
    keys = set(model.model_fields)
    for field in model.model_fields.values():
        choices = getattr(field.validation_alias, "choices", None)
        keys.update(c for c in choices or () if isinstance(c, str))
        if field.alias:
            keys.add(field.alias)
    return sorted(keys)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields: list[dict[str, Any]] = []
        item: dict[str, Any]
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                # loc holds a character offset here, not a field name.
                position = err.get("loc", ("body", "?"))[-1]
                item = {
                    "field": "body",
                    "problem": f"malformed JSON at character {position}: "
                    f"{(err.get('ctx') or {}).get('error', err.get('msg'))}",
                }
                fields.append(item)
                continue
            item = {"field": _field_path(tuple(err.get("loc", ()))), "problem": err.get("msg")}
            ctx = err.get("ctx") or {}
            if "expected" in ctx:
                item["allowed"] = ctx["expected"]
            elif err.get("type") == "extra_forbidden":
                keys = allowed_keys(request, tuple(err.get("loc", ())))
                if keys:
                    item["problem"] = f"unknown key; allowed: {', '.join(keys)}"
                    item["allowed"] = keys
            fields.append(item)
        names = ", ".join(sorted({f["field"] for f in fields}))
        return JSONResponse(
            status_code=422,
            content={
                "error": "invalid_input",
                "message": f"invalid request: {names}",
                "fields": fields,
                "hint": "see GET /docs for the request schema",
                "trace_id": trace_id_of(request),
            },
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (unknown path, wrong method, a body it cannot parse) in
        # the gateway's shape, not FastAPI's {"detail": ...}.
        code, hint = HTTP_CODES.get(exc.status_code, ("http_error", None))
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            code = "invalid_input"
            message = "the body is not valid JSON in UTF-8 (or nests deeper than JSON allows)"
            hint = "send a UTF-8 JSON object; see GET /docs for the request schema"
        elif exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse(
            status_code=exc.status_code,
            content={
                "error": code,
                "message": message,
                "hint": hint,
                "trace_id": trace_id_of(request),
            },
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(GatewayError)
    async def _gateway(request: Request, exc: GatewayError) -> JSONResponse:
        if exc.status_code >= 500:
            logger.warning(
                "%s %s -> %s: %s", request.method, request.url.path, exc.status_code, exc.message
            )
        return JSONResponse(
            status_code=exc.status_code,
            content=error_content(exc, trace_id_of(request)),
            headers=exc.headers or None,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            status_code=500,
            content={
                "error": "internal_error",
                "message": f"{type(exc).__name__}",
                "trace_id": trace_id_of(request),
            },
        )
