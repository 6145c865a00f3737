"""One connection to Milvus (Milvus Lite server or a cluster): connect, call with one retry on
a fresh connection, and tell its owners when it was replaced."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.tracing import keep_log_handlers

logger = logging.getLogger(__name__)


def import_pymilvus() -> ModuleType:
    """pymilvus, imported (the first time) so that its import-time ``logging.config.dictConfig``
    leaves the process's handlers open: inside a Serve replica it otherwise closed the
    replica's JSON log file handler and the replica wrote no more lines there
    (``deployments.tracing.keep_log_handlers``). Every module that uses pymilvus calls this
    before its own ``from pymilvus import ...``; pymilvus stays a lazy import (the ingress
    never needs it)."""
    module = sys.modules.get("pymilvus")
    if module is not None:
        return module
    with keep_log_handlers():
        import pymilvus
    return pymilvus


# gRPC channel options of every connection.
GRPC_OPTIONS: dict[str, int] = {
    # No keepalive pings on an idle channel: the Milvus Lite server answers them with GOAWAY
    # "too_many_pings" and drops idle replicas' connections.
    "grpc.keepalive_permit_without_calls": 0,
    # Reconnect within seconds of a server's return: gRPC backs off up to 120 s by default,
    # and its process-wide subchannel pool kept that back-off across new channels, so after a
    # 10-minute Milvus outage the bus consumer failed for another 50-117 s (issue 34). Each
    # channel gets its own subchannels, retried at most 2 s apart.
    "grpc.initial_reconnect_backoff_ms": 500,
    "grpc.min_reconnect_backoff_ms": 500,
    "grpc.max_reconnect_backoff_ms": 2000,
    "grpc.use_local_subchannel_pool": 1,
}


class MilvusConnection:
    """A lazily opened ``MilvusClient``; thread-safe.

    Args:
        settings: URI, token, database and timeout.
    """

    def __init__(self, settings: MilvusSettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._ready = False
        self._lock = threading.Lock()
        self._on_reset: list[Callable[[], None]] = []

    def on_reset(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` whenever the connection is dropped: a new one may face a restarted
        server, so what was loaded or cached on the old one must be checked again."""
        self._on_reset.append(hook)

    def _connect(self) -> Any:
        import_pymilvus()
        from pymilvus import MilvusClient

        kwargs: dict[str, Any] = {
            "uri": self.settings.uri,
            "timeout": self.settings.timeout_s,
            "grpc_options": GRPC_OPTIONS,
        }
        if self.settings.token:
            kwargs["token"] = self.settings.token
        if self.settings.db_name:
            kwargs["db_name"] = self.settings.db_name
        return MilvusClient(**kwargs)

    def start(self, *, check: bool = False) -> None:
        """Connect; idempotent. ``check`` makes a round trip even when connected."""
        with self._lock:
            if self._ready and not check:
                return
            try:
                if self._client is None:
                    self._client = self._connect()
                self._client.list_collections(timeout=self.settings.timeout_s)
            except Exception as exc:
                self._client, self._ready = None, False
                raise BackendUnavailable(
                    "milvus",
                    f"cannot reach {self.settings.uri}: {exc}",
                    hint="start it with `python scripts/services.py up` or set MILVUS__URI",
                ) from exc
            self._ready = True

    @property
    def client(self) -> Any:
        """The connected ``MilvusClient`` (for iterators, which span several calls)."""
        self.start()
        return self._client

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a client method, connecting first. Every operation the gateway makes is
        idempotent, so a failure (often a connection the server dropped while idle) is
        retried once on a fresh connection before it becomes ``BackendUnavailable``."""
        if method in WRITES:
            kwargs.setdefault("timeout", self.settings.write_timeout_s)
        elif method in TIMED_READS:
            kwargs.setdefault("timeout", self.settings.timeout_s)
        if method in CONSISTENT_READS:
            kwargs.setdefault("consistency_level", "Strong")
        for attempt in (1, 2):
            self.start()
            try:
                return getattr(self._client, method)(*args, **kwargs)
            except InvalidInput:
                raise
            except Exception as exc:
                if already_exists(exc):
                    raise BackendUnavailable("milvus", f"{what} failed: {exc}") from exc
                if timed_out(exc):  # a retry would only double the wait
                    raise BackendUnavailable(
                        "milvus", f"{what}: no answer within {kwargs.get('timeout')} s"
                    ) from exc
                self.reset()
                if attempt == 2:
                    raise BackendUnavailable("milvus", f"{what} failed: {exc}") from exc
                logger.warning("milvus %s failed (%s); reconnecting and retrying once", what, exc)
        raise AssertionError("unreachable")

    def reset(self) -> None:
        """Drop the connection (the next call opens a new one) and tell the owners."""
        with self._lock:
            client, self._client, self._ready = self._client, None, False
            for hook in self._on_reset:
                hook()
        if client is not None:
            try:
                client.close()
            except Exception:  # already broken
                logger.debug("closing a broken Milvus client failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            client, self._client, self._ready = self._client, None, False
        if client is not None:
            client.close()


# The client methods given a deadline per call: writes (MilvusSettings.write_timeout_s) and
# the reads of ingestion and collection management (timeout_s). Searches are bounded by the
# gateway (search.store_deadline_s); loading a collection may take long on a cluster.
WRITES = frozenset({"upsert", "delete", "flush"})
TIMED_READS = frozenset({"query", "has_collection", "describe_collection", "describe_alias"})
# Reads of chunks, always at Strong consistency: a search or a memory-index replay must see
# every write acknowledged before it (an ACL tightening, a delete), on every replica. The
# collections' own default is pymilvus's Bounded, under which a Milvus cluster may answer
# from data a few seconds old (Milvus Lite serves every level the same way).
CONSISTENT_READS = frozenset({"search", "query", "hybrid_search"})


def timed_out(exc: Exception) -> bool:
    """A call that ran past its deadline (gRPC DEADLINE_EXCEEDED, as pymilvus reports it)."""
    text = str(exc).lower()
    return "deadline" in text or "timed out" in text or "timeout" in type(exc).__name__.lower()


def already_exists(exc: Exception) -> bool:
    return "already exist" in str(exc).lower()
