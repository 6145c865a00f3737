"""A model loaded once in a worker thread of the running event loop, so a replica answers
``status()`` while its weights load; the Serve shells and the ingress's query embedder use it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from deployments.errors import BackendUnavailable

logger = logging.getLogger(__name__)


class BackgroundLoad:
    """Runs ``start`` once, off the loop. A failure is kept for ``error`` (``status()``
    shows it) and raised again, as ``BackendUnavailable`` naming ``backend``, to every caller
    of ``wait``.
    """

    def __init__(self, start: Callable[[], None], backend: str) -> None:
        self._start = start
        self.backend = backend
        self.error: str | None = None
        self._future: asyncio.Future[None] | None = None

    def begin(self) -> None:
        """Start loading in a worker thread of the running loop (idempotent)."""
        if self._future is None:
            self._future = asyncio.get_running_loop().run_in_executor(None, self._run)

    def _run(self) -> None:
        try:
            self._start()
        except Exception as exc:
            logger.exception("%s failed to load", self.backend)
            self.error = f"{type(exc).__name__}: {exc}"
            raise

    async def wait(self) -> None:
        """Until the model is loaded (starting the load if nobody did)."""
        self.begin()
        assert self._future is not None
        try:
            await asyncio.shield(self._future)
        except Exception as exc:
            raise BackendUnavailable(self.backend, f"model failed to load: {exc}") from exc
