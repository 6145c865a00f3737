"""Bounds on a request's URL and on reading its body, enforced as it arrives (ASGI
middleware).

* ``http.max_url_bytes``: a longer URL (path and query string) gets ``414`` at once
  (``UrlLimit``). The gateway's routes take their input in JSON bodies; a URL of kilobytes
  is a mistake or a probe. A request head over 16 KiB never reaches the gateway: HAProxy,
  Ray Serve's HTTP front (deployments/serve_env.py), refuses it with its own HTML ``400``
  (with Serve's Python proxy instead: past 65,535 bytes, a plain-text 400; docs/operations.md,
  "Request limits").

* ``http.body_read_timeout_s``: the whole body must arrive within this time after the request
  starts; a client that sends part of a body and stalls gets ``408`` instead of holding a
  connection and a replica slot until the proxy's own request timeout.
* ``http.max_body_bytes``: a larger body (by its ``Content-Length``, or counted as it
  streams in) gets ``413`` before the rest is read.

Both answers come from the gateway's error handlers (serve_app/http/errors.py), in its JSON shape:
the wrapped ``receive`` raises Starlette's ``HTTPException``, which FastAPI passes through
its body parsing unchanged.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from serve_app.http.errors import HTTP_CODES, trace_id_of


class UrlLimit:
    """Answers ``414`` in the gateway's error shape to a request whose URL (path, ``?`` and
    query string, as sent) is longer than ``max_bytes``."""

    def __init__(self, app: Any, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("raw_path") or scope.get("path", "").encode()
        query = scope.get("query_string") or b""
        size = len(path) + (len(query) + 1 if query else 0)
        if size <= self.max_bytes:
            await self.app(scope, receive, send)
            return
        code, hint = HTTP_CODES[414]
        response = JSONResponse(
            status_code=414,
            content={
                "error": code,
                "message": f"the request URL is {size} bytes (query string {len(query)}), "
                f"more than the {self.max_bytes} allowed",
                "hint": hint,
                "trace_id": trace_id_of(Request(scope)),
            },
        )
        await response(scope, receive, send)


class BodyLimits:
    def __init__(self, app: Any, *, timeout_s: float, max_bytes: int) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        deadline = time.monotonic() + self.timeout_s
        received = 0
        done = False

        def too_large(size: int) -> HTTPException:
            return HTTPException(
                413, f"the request body is {size} bytes, more than the {self.max_bytes} allowed"
            )

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, done
            if done:  # after the body: a disconnect, whenever it comes
                return await receive()
            if declared is not None and declared > self.max_bytes:
                raise too_large(declared)
            remaining = deadline - time.monotonic()
            try:
                # In this task (wait_for would start one per message): a body the server
                # has already read answers at once, with no turn of the event loop.
                async with asyncio.timeout(max(remaining, 0.001)):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(
                    408,
                    f"the request body did not arrive within {self.timeout_s:g} s "
                    f"({received} of {declared if declared is not None else '?'} bytes)",
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large(received)
                done = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
