"""The shared parts every route's dependencies use — the settings, the authenticator, the
rate limiter, the agent profiles and the recorder of denials — as one value on
``app.state.shared``. Defined here, below the features, so that serve_app/http/deps.py reads
them without importing a feature or the composition root (which imports every feature)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from deployments.errors import GatewayError
from serve_app.auth import Authenticator, Principal
from serve_app.http.rate_limits import RateLimiter
from serve_app.profiles import ProfileSet
from serve_app.settings import GatewaySettings


class DenialRecorder(Protocol):
    """What http/ needs of the audit recorder (serve_app/audit/recorder.py): record a
    request that ended in an error (401, 429, ...) before any feature ran."""

    def error(
        self,
        exc: GatewayError,
        trace_id: str,
        principal: Principal | None,
        started: float | None = None,
        *,
        denied: bool | None = None,
        **fields: Any,
    ) -> None: ...


@dataclass(frozen=True)
class Shared:
    settings: GatewaySettings
    authenticator: Authenticator
    rate_limiter: RateLimiter
    profiles: ProfileSet
    recorder: DenialRecorder
