"""RequestContext: what every audited request carries from its route to the audit record —
the verified caller, the trace id and when the request began. Built once per request by the
``Caller`` dependency (serve_app/http/deps.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from serve_app.auth.principal import Principal


@dataclass(frozen=True)
class RequestContext:
    trace_id: str
    principal: Principal
    # time.perf_counter() when the request's own work began (after authentication).
    started: float = field(default_factory=time.perf_counter)
    # The agent a router named with X-Agent-Id, kept only when the credential may route
    # (profiles.route_permission) or in development mode; it picks the RAG profile.
    routed_agent: str = ""

    @property
    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 1)
