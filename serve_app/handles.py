"""Adapts Serve ``DeploymentHandle``s to the backend protocols of ``deployments.protocols``.

A deployment method ``m`` becomes an awaitable ``proxy.m(...)``. Errors raised on purpose in
a replica (``GatewayError``) reach the caller as themselves; anything else (a dead replica, an
unexpected crash) becomes ``BackendUnavailable`` naming the backend.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from deployments.errors import BackendUnavailable, GatewayError
from deployments.protocols import SearchFilter, SearchHit
from deployments.vector_store.memindex.front import MEMORY_METHODS, MemoryFront
from deployments.vector_store.model_choice import QueryVectors

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


# Searches (read ids) remembered as sent to the Retriever: their later calls go there too.
SENT_KEPT = 4096


class MemoryFirstStore:
    """The Retriever's handle behind the in-memory index this Ingress replica holds
    (``milvus.memory_index.serve_from``): a search of a loaded, in-sync team is answered here
    with no hop; anything else (a team still loading or over the budget, the learned sparse
    method, a change of model) goes to the Retriever, which searches Milvus.

    One search reads one version (deployments/vector_store/memindex/pins.py) across its calls: a
    call after one answered here passes the version read (``pinned``), and a search whose first
    call went to the Retriever sends all its calls there.
    """

    def __init__(self, remote: StoreProxy, memory: MemoryFront) -> None:
        self._remote = remote
        self.memory = memory
        self._sent: OrderedDict[str, None] = OrderedDict()

    def __getattr__(self, name: str) -> Any:  # every other method: the Retriever's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._remote, name)

    async def candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str = "",
        query_lexical: Mapping[int, float] | None = None,
        query_vectors: QueryVectors | None = None,
        generation: int | None = None,
    ) -> dict[str, list[SearchHit]]:
        """``RetrieverDeployment.candidates``, the same arguments."""
        local = query_vectors is None and not query_lexical
        if local and set(methods) <= MEMORY_METHODS and read_id not in self._sent:
            found = await self.memory.answer(
                query_text, query_vector, flt, limit, methods, read_id, generation
            )
            if found is not None:
                return found
        # Only what is set is passed (a Retriever of an older version need not know it).
        more: dict[str, Any] = {"query_lexical": query_lexical} if query_lexical else {}
        if generation is not None:
            more["generation"] = generation
        if query_vectors is not None:
            more["query_vectors"] = query_vectors
        pinned = self.memory.hot.pins.get(flt.team_id, read_id)
        if pinned:
            more["pinned"] = pinned
        elif read_id:
            self._sent[read_id] = None
            if len(self._sent) > SENT_KEPT:
                self._sent.popitem(last=False)
        found = await self._remote.candidates(
            query_text, query_vector, flt, limit, methods, read_id, **more
        )
        return dict(found)

    async def status(self) -> dict[str, Any]:
        """The Retriever's status, with this replica's in-memory index."""
        status = await self._remote.status()
        return {**status, "memory_index": {**self.memory.hot.status(), "held_by": "ingress"}}

    def close(self) -> None:
        self.memory.hot.close()
