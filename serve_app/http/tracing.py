"""The trace id of each HTTP request: in every response, and in every log line of the ingress.

``install_tracing(app)`` (serve_app/asgi.py) wraps the whole app in ``TraceContext``, a pure
ASGI middleware that

- decides the request's trace id once (``serve_app.http.errors.trace_id_of``: a valid W3C
  ``traceparent``'s trace id, else ``X-Trace-Id``, else a new uuid4 hex) and makes it the
  current one (``deployments.tracing.TRACE_ID``) for the request's duration: every log record
  of the request gets it as ``trace_id`` (``TraceIdFilter``);
- answers with ``X-Trace-Id: <trace id>`` and ``traceparent: 00-<trace id>-<new span id>-<flags>``
  (the caller's sampled flag kept); error answers too, 500 included: the middleware sits
  outside Starlette's ``ServerErrorMiddleware``, where ``app.add_middleware`` cannot reach. A
  trace id that is no W3C trace id (an ``X-Trace-Id`` such as ``job-42``) gets no
  ``traceparent``: one that named another id would contradict ``X-Trace-Id``.

Inside a Serve replica it also sends the log records of ``serve_app``, ``batch_ingest`` and
``deployments`` to Serve's own logger (``ray.serve``) instead of the root logger: they land in
the replica's log file beside Serve's (JSON when the application's ``logging_config`` says
``encoding: JSON``) with Serve's ``request_id``, ``route``, ``application``, ``deployment`` and
``replica`` and our ``trace_id``; Serve's access log line, written after the request outside
its context, gets the trace id its request id had. Handle calls to the other deployments
carry no trace id (their logs have none).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request

from deployments import serve_log
from deployments.tracing import TRACE_ID, TraceIdFilter, single_traceparent, traceparent_for
from serve_app.http.errors import trace_id_of

_TRACE_HEADERS = (b"x-trace-id", b"traceparent")
# Serve request id → trace id, for Serve's access log line (bounded: the line comes right
# after the response; a request whose line never comes is dropped with the oldest).
_BY_REQUEST: OrderedDict[str, str] = OrderedDict()
_BY_REQUEST_MAX = 4096
# The access log is written on the replica's main loop, requests run on the user-code loop.
_BY_REQUEST_LOCK = threading.Lock()
_serve_logs = False


class TraceContext:
    """ASGI middleware: the request's trace id is current while it runs; its response carries
    ``X-Trace-Id`` and ``traceparent``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        trace_id = trace_id_of(request)
        parent = single_traceparent(request.headers.getlist("traceparent"))
        sampled = parent is not None and parent.trace_id == trace_id and parent.sampled
        added = [(b"x-trace-id", trace_id.encode("latin-1"))]
        traceparent = traceparent_for(trace_id, sampled)
        if traceparent is not None:
            added.append((b"traceparent", traceparent.encode("ascii")))
        if _serve_logs:
            _remember(_serve_request_id(), trace_id)

        async def send_traced(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                kept = [h for h in message.get("headers", []) if h[0].lower() not in _TRACE_HEADERS]
                message = {**message, "headers": [*kept, *added]}
            await send(message)

        token = TRACE_ID.set(trace_id)
        try:
            await self.app(scope, receive, send_traced)
        finally:
            TRACE_ID.reset(token)


def install_tracing(app: FastAPI) -> None:
    """Wrap ``app``'s whole middleware stack (built on its first request) in
    ``TraceContext``; inside a Serve replica, send our log records to Serve's log."""
    build = app.build_middleware_stack

    def build_traced() -> Any:
        return TraceContext(build())

    app.build_middleware_stack = build_traced  # type: ignore[method-assign]
    route_logs_to_serve()


# --- Serve's log -------------------------------------------------------------------------------


class _ServeTraceFilter(TraceIdFilter):
    """On Serve's logger: the current trace id; Serve's access log line (written after the
    request, outside its context) gets the one its request id had."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "trace_id", None):
            trace = TRACE_ID.get()
            if not trace and getattr(record, "serve_access_log", False):
                with _BY_REQUEST_LOCK:
                    trace = _BY_REQUEST.pop(str(getattr(record, "request_id", "")), "")
            record.trace_id = trace
        return True


def route_logs_to_serve() -> bool:
    """Inside a Serve replica (deployments/serve_log.py): our packages' records go to Serve's
    logger, and Serve's records carry ``trace_id``, its access log line too. False (and
    nothing changes) anywhere else."""
    global _serve_logs
    _serve_logs = serve_log.route_logs_to_serve(_ServeTraceFilter())
    return _serve_logs


def _serve_request_id() -> str:
    """Serve's id of the request in progress (the ``request_id`` of its log lines)."""
    try:
        from ray.serve.context import _get_serve_request_context

        return str(_get_serve_request_context().request_id or "")
    except Exception:  # a Ray without it: access log lines go without trace id
        return ""


def _remember(request_id: str, trace_id: str) -> None:
    if not request_id:
        return
    with _BY_REQUEST_LOCK:
        _BY_REQUEST[request_id] = trace_id
        while len(_BY_REQUEST) > _BY_REQUEST_MAX:
            _BY_REQUEST.popitem(last=False)
