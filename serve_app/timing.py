"""Where a request's time goes, as a ``Server-Timing`` response header (W3C Server Timing).

``ServerTiming`` (ASGI middleware) gives every HTTP request a fresh record; code on the
request's path wraps its stages in ``stage("embed")`` etc. (tasks the request starts share the
record); the response carries ``Server-Timing: auth;dur=0.41, embed;dur=6.20, …, app;dur=…``
in milliseconds, ``app`` being the whole ingress from request to response start. Operators and
``bench/bench_search_real.py`` read the gateway's own cost over its backends off it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_record: ContextVar[dict[str, float] | None] = ContextVar("server_timing", default=None)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Add the time spent in the block to ``name`` of the current request (if any)."""
    record = _record.get()
    if record is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        record[name] = record.get(name, 0.0) + (time.perf_counter() - started) * 1000


def header_value(record: dict[str, float]) -> str:
    return ", ".join(f"{name};dur={ms:.2f}" for name, ms in record.items())


class ServerTiming:
    """ASGI middleware adding the ``Server-Timing`` header to every HTTP response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record: dict[str, float] = {}
        token = _record.set(record)
        started = time.perf_counter()

        async def send_with_timing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                record["app"] = (time.perf_counter() - started) * 1000
                headers = [
                    *message.get("headers", []),
                    (b"server-timing", header_value(record).encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_timing)
        finally:
            _record.reset(token)


class InFlight:
    """How many HTTP requests this process is handling now (``CountInFlight`` counts them;
    one event loop, so no lock). The ingress embeds a query itself only while its request
    is the only one (``deployments.models.embedding.SplitEmbedder``)."""

    def __init__(self) -> None:
        self.count = 0

    def busy(self) -> bool:
        """Another request is in progress besides the caller's own."""
        return self.count > 1


class CountInFlight:
    """ASGI middleware keeping ``gauge.count`` at the number of HTTP requests in progress."""

    def __init__(self, app: Any, gauge: InFlight) -> None:
        self.app = app
        self.gauge = gauge

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.gauge.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.gauge.count -= 1
