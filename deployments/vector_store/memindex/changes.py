"""The change log that keeps every replica's in-memory index coherent with Milvus.

It is one small Milvus collection (``<base>__changes``) beside the chunk collections, so
every writer — the Retriever replicas, the bus consumer, a reindex job on another node —
records its writes where every reader sees them, and Milvus stays the only system of record.

* A write of a team's live collection (upsert or delete) records a *change row*
  ``{name: <alias>, at_ms, chunk_ids}`` and, in the same upsert, bumps the alias's *head row*
  (``head:<alias>``, a fresh random token). The writer acknowledges only after that.
* A reindex swap (``switch_alias``) bumps the alias's *swap row* (``swap:<alias>``) and, in
  the same upsert, clears the alias's *announcement* (``next:<alias>``).
* A reindex job about to swap *announces* the physical version it will swap to
  (``next:<alias>``, naming that collection, a fresh token): readers load a staged copy of it
  before the swap. From then on its writes into that version are recorded as change rows
  named after the *physical* collection (bumping the alias's head), so the staged copy can
  replay them. A failed job withdraws the announcement (the row names nothing).
* A reader checks the three rows of its team with one primary-key ``get`` per search. An unchanged
  head means nothing was written since it last looked; a new head means: read the change rows
  from ``at_ms >= watermark - lookback`` and re-read those chunk ids from Milvus (present →
  upsert, absent → remove: state-based, so applying one twice or late is harmless). A new swap
  token means: load the team again from the collection the alias now names.
* ``lookback`` covers a writer whose change row carries an earlier ``at_ms`` than one already
  seen (it took its timestamp first but committed later: at most one call timeout) and the
  clock skew between writers. Change rows older than ``retention`` are pruned; a reader that
  did not look for longer than that reloads its team instead of replaying.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deployments.vector_store.client import import_pymilvus
from deployments.vector_store.filter import milvus_list

logger = logging.getLogger(__name__)

IDS_PER_ROW = 1024
MAX_ID = 256
CHANGES_SUFFIX = "__changes"


@dataclass(frozen=True)
class Heads:
    """The tokens of an alias's head row (any write) and swap row (reindex swap), and its
    announcement: the physical version a reindex will swap to (``next``, ``""`` when none)
    and that row's token. ``""`` when never written."""

    rows: str
    swap: str
    next: str = ""
    next_token: str = ""


@dataclass(frozen=True)
class Change:
    change_id: str
    at_ms: int
    chunk_ids: tuple[str, ...]


def now_ms() -> int:
    return int(time.time() * 1000)


class ChangeLog:
    """Change rows and head tokens in ``<collection>__changes``.

    Args:
        collection: the chunk collections' base name.
        call: ``MilvusStore._call`` (connect, retry once, map errors to BackendUnavailable).
        retention_s: change rows older than this are pruned (by writers, at most once a
            minute).
    """

    def __init__(
        self, collection: str, call: Callable[..., Any], *, retention_s: float = 3600.0
    ) -> None:
        self.name = collection + CHANGES_SUFFIX
        self._call = call
        self.retention_s = retention_s
        self._ready = False
        self._lock = threading.Lock()
        self._last_prune = 0.0

    def reset(self) -> None:
        """Forget that the collection exists (it was dropped, or the server restarted)."""
        self._ready = False

    def ensure(self) -> None:
        """Create (idempotently) and load the change collection."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            if not self._call("has collection", "has_collection", self.name):
                try:
                    self._call("create collection", "create_collection", self.name, **_schema())
                    logger.info("created Milvus collection %s", self.name)
                except Exception:
                    if not self._call("has collection", "has_collection", self.name):
                        raise
            self._call("load", "load_collection", self.name)
            self._ready = True

    def record(self, alias: str, chunk_ids: list[str], *, name: str = "") -> None:
        """Record that ``chunk_ids`` of ``alias`` were written or deleted, and bump its head.

        ``name``: the name the change rows carry when it is not the alias (an announced
        physical version, written before its swap); the head bumped is the alias's still."""
        if not chunk_ids:
            return
        self.ensure()
        at = now_ms()
        rows = [
            _row(
                f"chg:{uuid.uuid4().hex}", name or alias, "rows", at, chunk_ids[i : i + IDS_PER_ROW]
            )
            for i in range(0, len(chunk_ids), IDS_PER_ROW)
        ]
        rows.append(_row(f"head:{alias}", alias, "head", at))
        self._call("record change", "upsert", self.name, rows)
        self._maybe_prune()

    def record_swap(self, alias: str) -> None:
        """Record that ``alias`` now names another physical collection; its announcement is
        cleared in the same upsert (the swap ends it, whichever version it named)."""
        self.ensure()
        at = now_ms()
        rows = [_row(f"swap:{alias}", alias, "swap", at), _row(f"next:{alias}", "", "next", at)]
        self._call("record swap", "upsert", self.name, rows)

    def announce(self, alias: str, physical: str) -> None:
        """Announce that ``alias`` will be swapped to ``physical`` (a fresh token each time)."""
        self.ensure()
        self._call(
            "announce", "upsert", self.name, [_row(f"next:{alias}", physical, "next", now_ms())]
        )

    def withdraw(self, alias: str) -> None:
        """Clear ``alias``'s announcement (the reindex failed or its version was dropped)."""
        self.ensure()
        self._call("withdraw", "upsert", self.name, [_row(f"next:{alias}", "", "next", now_ms())])

    def announced(self, alias: str) -> str:
        """The physical version ``alias`` is announced to swap to; ``""`` when none."""
        return self.heads(alias).next

    def heads(self, alias: str) -> Heads:
        """The tokens and the announcement of ``alias`` in one primary-key read."""
        self.ensure()
        found = self._call(
            "read heads",
            "get",
            self.name,
            ids=[f"head:{alias}", f"swap:{alias}", f"next:{alias}"],
            output_fields=["id", "token", "name"],
            consistency_level="Strong",
        )
        rows = {row["id"].split(":", 1)[0]: row for row in found}

        def token(kind: str) -> str:
            return str(rows[kind]["token"]) if kind in rows else ""

        announced = rows.get("next")
        return Heads(
            rows=token("head"),
            swap=token("swap"),
            next=str(announced["name"]) if announced else "",
            next_token=token("next"),
        )

    def since(self, names: str | tuple[str, ...], at_ms: int) -> list[Change]:
        """Change rows named ``names`` (an alias, or it and a physical version) with
        ``at_ms`` at or after the given time, oldest first."""
        self.ensure()
        wanted = (names,) if isinstance(names, str) else names
        found = self._call(
            "read changes",
            "query",
            self.name,
            filter=f'name in {milvus_list(list(wanted))} and kind == "rows" '
            f"and at_ms >= {int(at_ms)}",
            output_fields=["id", "at_ms", "chunk_ids"],
            consistency_level="Strong",
        )
        changes = [
            Change(row["id"], int(row["at_ms"]), tuple(row.get("chunk_ids") or ())) for row in found
        ]
        return sorted(changes, key=lambda c: (c.at_ms, c.change_id))

    def _maybe_prune(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < 60.0:
            return
        self._last_prune = now
        cutoff = now_ms() - int(self.retention_s * 1000)
        try:
            self._call(
                "prune changes", "delete", self.name, filter=f'kind == "rows" and at_ms < {cutoff}'
            )
            # Milvus Lite scans unflushed rows on every filtered read (``since``).
            self._call("flush changes", "flush", self.name)
        except Exception:  # housekeeping; the next writer tries again
            logger.warning("pruning %s failed", self.name, exc_info=True)


def _row(
    row_id: str, name: str, kind: str, at_ms: int, chunk_ids: list[str] | None = None
) -> dict[str, Any]:
    return {
        "id": row_id,
        "name": name,
        "kind": kind,
        "at_ms": at_ms,
        "token": uuid.uuid4().hex,
        "chunk_ids": list(chunk_ids or []),
        # Milvus needs a vector field in every collection; this one is never searched.
        "v": [0.0, 0.0],
    }


def _schema() -> dict[str, Any]:
    import_pymilvus()
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID + 8)
    schema.add_field("name", DataType.VARCHAR, max_length=MAX_ID)
    schema.add_field("kind", DataType.VARCHAR, max_length=16)
    schema.add_field("at_ms", DataType.INT64)
    schema.add_field("token", DataType.VARCHAR, max_length=64)
    schema.add_field(
        "chunk_ids",
        DataType.ARRAY,
        element_type=DataType.VARCHAR,
        max_capacity=IDS_PER_ROW,
        max_length=MAX_ID,
    )
    schema.add_field("v", DataType.FLOAT_VECTOR, dim=2)
    index = MilvusClient.prepare_index_params()
    index.add_index("v", index_type="FLAT", metric_type="L2")
    index.add_index("name", index_type="INVERTED")
    return {"schema": schema, "index_params": index}
