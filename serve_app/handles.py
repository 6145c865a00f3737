"""Adapts Serve ``DeploymentHandle``s to the backend protocols of ``deployments.protocols``.

A deployment method ``m`` becomes an awaitable ``proxy.m(...)``. Errors raised on purpose in
a replica (``GatewayError``) reach the caller as themselves; anything else (a dead replica, an
unexpected crash) becomes ``BackendUnavailable`` naming the backend.
"""

from __future__ import annotations

from typing import Any

from deployments.errors import BackendUnavailable, GatewayError


class HandleProxy:
    def __init__(self, handle: Any, backend: str) -> None:
        self._handle = handle
        self._backend = backend

    def __getattr__(self, name: str) -> Any:  # each backend method, as a coroutine function
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._handle, name)
        backend = self._backend

        async def call(*args: Any, **kwargs: Any) -> Any:
            from ray.exceptions import RayTaskError

            try:
                return await method.remote(*args, **kwargs)
            except GatewayError:
                raise
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, GatewayError):
                    raise cause from None
                raise BackendUnavailable(
                    backend, f"{type(cause or exc).__name__}: {cause or exc}"
                ) from exc
            except Exception as exc:
                raise BackendUnavailable(backend, f"{type(exc).__name__}: {exc}") from exc

        return call
