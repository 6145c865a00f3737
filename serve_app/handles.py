"""Adapts Serve ``DeploymentHandle``s to the backend protocols of ``deployments.protocols``.

A deployment method ``m`` becomes an awaitable ``proxy.m(...)``. Errors raised on purpose in
a replica (``GatewayError``) reach the caller as themselves; anything else (a dead replica, an
unexpected crash) becomes ``BackendUnavailable`` naming the backend.
"""

from __future__ import annotations

import logging
import pickle
import re
from typing import Any

from deployments.errors import BackendUnavailable, GatewayError

logger = logging.getLogger(__name__)
# What of a replica's failure reaches a caller: one line, no terminal colours, no more than
# this (a Ray error's text holds a traceback with internal paths and PIDs: the log keeps it).
MAX_REASON_CHARS = 300
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def short_reason(error: BaseException) -> str:
    """``Type: first line of the message`` of ``error``, at most MAX_REASON_CHARS."""
    text = _ANSI.sub("", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # Ray's own wrappers put their traceback first and the cause's message last.
    if any(line.startswith("Traceback") for line in lines):
        lines = lines[-1:]
    first = next((line for line in lines if not _is_trace(line)), "")
    reason = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"


def _is_trace(line: str) -> bool:
    return line.startswith(("Traceback", "File ", "ray::", "^", "~")) or "(pid=" in line


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
                logger.warning("%s call %s failed: %s", backend, name, exc)
                raise BackendUnavailable(backend, short_reason(cause or exc)) from exc
            except Exception as exc:
                logger.warning("%s call %s failed: %s", backend, name, exc)
                raise BackendUnavailable(backend, short_reason(exc)) from exc

        return call


class StoreProxy(HandleProxy):
    """The Retriever's handle: ``candidates`` travel as one standard pickle
    (``RetrieverDeployment.candidates_packed``), every other method as any handle call."""

    async def candidates(self, *args: Any, **kwargs: Any) -> Any:
        # The payload comes from the gateway's own Retriever replica, never from a caller.
        return pickle.loads(await self.candidates_packed(*args, **kwargs))  # noqa: S301
