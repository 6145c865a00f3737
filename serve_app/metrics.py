"""The ingress's Prometheus metrics, through Ray Serve (deployments/metrics.py: made on first
use inside a replica, no-ops anywhere else).

``RequestMetrics`` (ASGI middleware) times every HTTP request by its route template, status
class and, for a search, the mode it ran in (``note_search_mode``, set by the search on the
request's own label record, like serve_app/timing.py's stages). The search, the audit
recorder and the audit log record the rest through the ``record_*`` helpers here.
docs/operations.md, "Metrics", lists every metric.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from deployments.metrics import SECONDS, Counter, Histogram

REQUEST_DURATION = Histogram(
    "rag_gateway_request_duration_seconds",
    "HTTP requests of the gateway: time from request to the end of the response, by route "
    "template (endpoint), search mode (hybrid, dense, bm25, off; '-' for other requests) and "
    "status class (2xx, 4xx, 5xx)",
    SECONDS,
    ("endpoint", "mode", "status"),
)
# 0.5 as the first bound: its bucket counts the searches that returned nothing.
SEARCH_MATCHES = Histogram(
    "rag_gateway_search_matches",
    "Matches returned by rag.search_docs, by search mode",
    [0.5, 1, 2, 3, 5, 10, 20, 50],
    ("mode",),
)
DEGRADED = Counter(
    "rag_gateway_degraded_responses",
    "rag.search_docs answers that were degraded, by reason class (embedder, reranker, graph, "
    "store, other); an answer with several reasons counts once per class",
    ("reason",),
)
DENIALS = Counter(
    "rag_gateway_denials",
    "Requests refused by authentication or policy, by HTTP status (401, 403; 503 for an "
    "identity that could not be checked) and reason code (team_not_granted, unauthorized, ...)",
    ("status", "reason"),
)
CACHE_LOOKUPS = Counter(
    "rag_gateway_cache_lookups",
    "Semantic cache lookups of rag.search_docs, by result (hit, miss, near_refused: a miss "
    "whose near duplicates failed the near check, bypass: not cacheable, unavailable: cache "
    "skipped after a failure)",
    ("result",),
)
AUDIT_RECORDS = Counter(
    "rag_gateway_audit_records",
    "Audit records by outcome: written, failed (a write attempt failed, kept for retry), "
    "dropped (lost: queue full while the database was down)",
    ("outcome",),
)

DEGRADED_CLASSES = ("embedder", "reranker", "graph", "store", "other")
# First match wins: "embedder unavailable, fell back to BM25 only: milvus: ..." is the
# embedder's, whatever its cause says.
_DEGRADED_PATTERNS = (
    ("embedder", re.compile(r"\bembed")),
    ("reranker", re.compile(r"\brerank")),
    ("graph", re.compile(r"\bgraph\b|\bneo4j\b")),
    ("store", re.compile(r"\bmilvus\b|\bstore\b|\bregistry\b|\bgeneration\b|\bredis\b|\bcache\b")),
)
_REASON_CODE = re.compile(r"[^a-z0-9_]")

_labels: ContextVar[dict[str, str] | None] = ContextVar("metric_labels", default=None)


def degraded_class(reason: str) -> str:
    """The class of one degraded reason string (one of ``DEGRADED_CLASSES``)."""
    text = reason.casefold()
    for name, pattern in _DEGRADED_PATTERNS:
        if pattern.search(text):
            return name
    return "other"


def degraded_classes(reasons: Iterable[str]) -> list[str]:
    """The distinct classes of ``reasons``, in first-seen order."""
    return list(dict.fromkeys(degraded_class(r) for r in reasons))


def reason_code(reason: str | None) -> str:
    """A reason code as a bounded label value (the codes are short snake_case words)."""
    code = _REASON_CODE.sub("_", (reason or "unknown").casefold())[:48]
    return code or "unknown"


def cache_result(status: str) -> str:
    """``Lookup.status`` as a label value: hit, miss, near_refused, bypass or unavailable."""
    return "unavailable" if status.startswith("unavailable") else status


def status_class(status: int) -> str:
    return f"{status // 100}xx"


def endpoint_of(scope: dict[str, Any]) -> str:
    """The route template the router matched (``/graph/entities/{id}``), not the raw path
    (bounded); ``unmatched`` for a path no route serves. A plain ASGI endpoint (``/mcp``)
    names its path as ``route_path``: Starlette puts only the endpoint in the scope."""
    route = scope.get("route")
    path = getattr(route, "path", None) or getattr(scope.get("endpoint"), "route_path", None)
    return path if isinstance(path, str) and path else "unmatched"


def note_search_mode(mode: str) -> None:
    """Label the current request's latency with the search mode it ran in."""
    labels = _labels.get()
    if labels is not None:
        labels["mode"] = mode


def record_search(mode: str, matches: int, degraded_reasons: Iterable[str]) -> None:
    note_search_mode(mode)
    SEARCH_MATCHES.observe(matches, mode=mode)
    for reason in degraded_classes(degraded_reasons):
        DEGRADED.inc(reason=reason)


def record_cache(status: str) -> None:
    CACHE_LOOKUPS.inc(result=cache_result(status))


def record_denial(status: int, reason: str | None) -> None:
    DENIALS.inc(status=str(status), reason=reason_code(reason))


def record_audit(outcome: str, count: int = 1) -> None:
    AUDIT_RECORDS.inc(count, outcome=outcome)


class RequestMetrics:
    """ASGI middleware observing ``REQUEST_DURATION`` for every HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not REQUEST_DURATION.live:
            await self.app(scope, receive, send)
            return
        labels = {"mode": "-"}
        token = _labels.set(labels)
        status = 500  # no response started: the exception becomes a 500 outside
        started = time.perf_counter()

        async def send_with_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            _labels.reset(token)
            REQUEST_DURATION.observe(
                time.perf_counter() - started,
                endpoint=endpoint_of(scope),
                mode=labels["mode"],
                status=status_class(status),
            )
