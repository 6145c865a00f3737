"""Milvus Lite's server, with no read inside a flush's gap: what ``scripts/services.py`` runs.

Milvus Lite 3.2.2 flushes a collection in two steps: it first puts a fresh, empty MemTable in
place of the live one, then, under the collection's maintenance lock, writes the frozen one's
rows to segment files and refreshes the segments that reads scan (``Collection._trigger_flush``).
A ``get``, ``query`` or ``search`` takes its snapshot of the segments under that lock but reads
the MemTable after it, so one whose snapshot predates the swap and whose MemTable read follows
it (or whose snapshot falls between the swap and the lock) sees neither copy of the frozen
rows: a write acknowledged before the read began is missing from it — a new row absent, an
updated row in its previous state (``upsert`` keeps the new state in the MemTable and the old
one in a segment). Any client's flush opens that gap for every other client: the
change log's pruning flushes its collection, a reindex flushes the version it built, a bulk
load flushes every 2,000 rows, and Milvus Lite flushes by itself past 128 MB.

The gateway's read-after-write and its access lists rest on those reads: a replica that
reads the change log's head or a changed chunk inside the gap keeps a revoked document
visible, or drops a live one, until that chunk is written again (measured:
``tests/integration/test_lite_flush_reads.py``; bench/README.md has the figures). So this
module runs the same server with a gate per collection: a flush holds it exclusively from
the MemTable swap until the segments are refreshed; reads hold it shared, and a read that
arrives during a flush waits for its end. That wait is not new: a flush of 2,000 rows of 384
dimensions takes ~65–250 ms here, nearly all of it writing the segment files under the
maintenance lock or waiting for that lock behind a background compaction, which a read's
snapshot waited for already; the gate adds the swap before it and a flush's wait for the
reads in progress (each a few milliseconds).

    python -m deployments.vector_store.lite_server server --data-dir DIR --host 127.0.0.1 \\
        --port 19530

A Milvus Lite server started otherwise has the gap; a Milvus server (standalone or cluster)
has no such gap (its reads are MVCC snapshots) and needs none of this.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

# The engine's reads of rows: each runs inside the gate's shared side.
READS = ("get", "query", "search", "count", "num_entities", "partition_num_entities")
_PATCHED = "_rag_flush_gate_patched"
_CREATE = threading.Lock()  # makes a collection's gate once


class FlushGate:
    """A shared/exclusive lock: many readers at once, or one flush. Readers are not held
    back by a flush that only waits (a read inside another read of the same thread must
    not deadlock behind it); a flush waits until no read runs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._flushing = False

    def acquire_read(self) -> None:
        with self._cond:
            while self._flushing:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def acquire_flush(self) -> None:
        with self._cond:
            while self._flushing or self._readers:
                self._cond.wait()
            self._flushing = True

    def release_flush(self) -> None:
        with self._cond:
            self._flushing = False
            self._cond.notify_all()


def gate_of(collection: Any) -> FlushGate:
    """The collection's gate (made on first use)."""
    gate = collection.__dict__.get("_rag_flush_gate")
    if gate is None:
        with _CREATE:
            gate = collection.__dict__.setdefault("_rag_flush_gate", FlushGate())
    return gate


def _holding(side: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps a ``Collection`` method so that it runs holding its gate's ``side`` (``read``:
    shared, ``flush``: exclusive)."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def held(self: Any, *args: Any, **kwargs: Any) -> Any:
            gate = gate_of(self)
            getattr(gate, f"acquire_{side}")()
            try:
                return method(self, *args, **kwargs)
            finally:
                getattr(gate, f"release_{side}")()

        return held

    return wrap


_reading, _flushing = _holding("read"), _holding("flush")


def lite_collection() -> type:
    """Milvus Lite's ``Collection`` class."""
    from milvus_lite.engine.collection import Collection

    return Collection


def gated(collection_cls: type) -> dict[str, Any]:
    """The attributes that gate ``collection_cls``: its flush step exclusive, its reads
    shared (``patch`` sets them; a test may set them through ``monkeypatch``).

    Raises:
        RuntimeError: the class lacks a method this relies on (another Milvus Lite
            version): the server must not run believing it is gated.
    """
    missing = [m for m in ("_trigger_flush", *READS) if not hasattr(collection_cls, m)]
    if missing:
        raise RuntimeError(
            f"{collection_cls.__module__}.{collection_cls.__name__} has no {', '.join(missing)}:"
            " this Milvus Lite is not the one deployments/vector_store/lite_server.py gates"
        )
    out: dict[str, Any] = {"_trigger_flush": _flushing(collection_cls._trigger_flush)}  # type: ignore[attr-defined]
    for name in READS:
        attr = collection_cls.__dict__.get(name)
        if isinstance(attr, property):  # num_entities
            assert attr.fget is not None
            out[name] = property(_reading(attr.fget))
        else:
            out[name] = _reading(getattr(collection_cls, name))
    out[_PATCHED] = True
    return out


def patch(collection_cls: type | None = None) -> type:
    """Gate ``collection_cls`` (Milvus Lite's ``Collection`` by default) for the life of the
    process; idempotent. Returns the class."""
    cls = collection_cls or lite_collection()
    if not getattr(cls, _PATCHED, False):
        for name, value in gated(cls).items():
            setattr(cls, name, value)
    return cls


def main(argv: list[str] | None = None) -> int:
    """Milvus Lite's own command line (``server --data-dir ... --host ... --port ...``), with
    the collections gated."""
    patch()
    sys.stdout.write(
        "Milvus Lite: reads gated against flushes (deployments/vector_store/lite_server.py)\n"
    )
    from milvus_lite.cmdline import main as lite_main

    return int(lite_main(argv) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
