"""Serve's ``check_health`` for the deployment shells: a replica is failed (and replaced by
Serve) when its model failed to load, or when its backend has not answered for several
checks in a row (a fresh replica gets a fresh connection; the ingress degrades meanwhile)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from deployments.loading import BackgroundLoad

# Failed status checks in a row before a backend replica reports itself unhealthy (with
# Serve's health_check_period_s of 10 s: about a minute of a dead connection).
BACKEND_FAILURES = 6
STATUS_TIMEOUT_S = 5.0


def check_model(loading: BackgroundLoad) -> None:
    """Raise when the replica's model failed to load (loading is not a failure)."""
    if loading.error is not None:
        raise RuntimeError(f"{loading.backend}: model failed to load: {loading.error}")


class BackendHealth:
    """Counts a backend's failed status checks; raises after ``limit`` in a row."""

    def __init__(
        self,
        name: str,
        status: Callable[[], Awaitable[dict[str, Any]]],
        limit: int = BACKEND_FAILURES,
    ) -> None:
        self.name = name
        self.status = status
        self.limit = limit
        self.failures = 0

    async def check(self) -> None:
        try:
            state = await asyncio.wait_for(self.status(), STATUS_TIMEOUT_S)
            ok = bool(state.get("ready"))
            reason = state.get("error") or "not ready"
        except Exception as exc:  # a status that cannot even answer
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        self.failures = 0 if ok else self.failures + 1
        if self.failures >= self.limit:
            raise RuntimeError(
                f"{self.name}: {self.failures} failed health checks in a row ({reason})"
            )
