"""Chunk store over Milvus: ``MilvusStore`` (sync pymilvus client, run in threads by the
Serve shell): a team's collection opened or created on first use, idempotent upserts and
deletes recorded in the change log the in-memory index follows, filtered dense/BM25/learned
sparse search
and the reads the in-memory index loads from. The same code talks to the local Milvus Lite
server and a Milvus cluster. Beside it: client.py (the connection), schema.py
(the DDL), shapes.py (what each collection holds: fields, vector size, model), versions.py
(the versions behind a team's alias, for reindex), rows.py (rows ↔ records) and filter.py
(the compiled tenancy filter)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import ChunkRecord, SearchFilter, SearchHit
from deployments.vector_store.client import MilvusConnection
from deployments.vector_store.filter import (
    CompiledFilter,
    compile_filter,
    milvus_list,
    milvus_literal,
)
from deployments.vector_store.memindex.changes import ChangeLog
from deployments.vector_store.rows import (
    SEARCH_METHODS,
    chunk_to_row,
    collection_for,
    doc_expr,
    output_fields,
    row_to_chunk,
)
from deployments.vector_store.shapes import CollectionShapes, check_vectors
from deployments.vector_store.versions import CollectionVersions

logger = logging.getLogger(__name__)
BM25_PARAMS: dict[str, Any] = {"metric_type": "BM25"}


class MilvusStore:
    """The chunk collections in Milvus.

    Every operation names its team; ``collection_for`` maps the team to a logical collection
    name, which is an alias onto a physical, versioned collection (``<name>__v1``), so a
    reindex can build ``__v2`` beside it and swap the alias. Reads of a team that has no
    collection yet return nothing and create nothing.

    Args:
        settings: URI, credentials, base collection name, layout and index choice.
        dim: dense vector size; must match the embedder.
        lexical: the embedder makes learned sparse weights (BGE-M3): collections created
            from now on get the ``lexical`` field, and the ``lexical`` method searches it
            (in a collection without the field it finds nothing).
        embed_model: the tag of the model making ``dim``-d vectors, noted on the collections
            it creates (``CollectionShapes.model_of``).
        dims: other vector sizes a collection may hold (during a change of model).
        served: tags of the models this process embeds with: a team's collection of another
            model's vectors is refused (``CollectionShapes.check_model``). Empty: no check.
    """

    def __init__(
        self,
        settings: MilvusSettings,
        *,
        dim: int,
        lexical: bool = False,
        embed_model: str = "",
        dims: tuple[int, ...] = (),
        served: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        self.dim = dim
        self.lexical = lexical
        self.conn = MilvusConnection(settings)
        self._open: set[str] = set()  # logical names checked and loaded on this connection
        self._unflushed: dict[str, int] = {}
        self._open_lock = threading.Lock()
        # Every write of a live collection is recorded here, so the in-memory indexes of all
        # Retriever replicas see it (deployments/vector_store/memindex/changes.py).
        self.changes = ChangeLog(
            settings.collection, self.conn.call, retention_s=settings.memory_index.retention_s
        )
        self.conn.on_reset(self._forget_connection)
        self.shapes = CollectionShapes(
            self.conn,
            settings,
            dim,
            lexical=lexical,
            embed_model=embed_model,
            dims=dims,
            served=served,
        )
        self.versions = CollectionVersions(
            self.conn,
            self.shapes,
            alias_for=self.collection_for,
            changes=self.changes,
            on_switch=self._switched,
        )

    def _switched(self, alias: str) -> None:
        self._open.discard(alias)
        self.shapes.forget(alias)

    def _forget_connection(self) -> None:
        # A new connection may face a restarted server: load collections again.
        self._open.clear()
        self.shapes.forget()
        self.changes.reset()

    @property
    def collection(self) -> str:
        """The base name; see ``collection_for`` for a team's collection."""
        return self.settings.collection

    def collection_for(self, team_id: str) -> str:
        return collection_for(self.settings, team_id)

    def start(self) -> None:
        """Connect; idempotent. Collections are opened (and created) per team on first use."""
        self.conn.start()

    def open_collection(self, team_id: str) -> str | None:
        """The team's logical collection, loaded; ``None`` (nothing created) without one."""
        return self._collection(team_id, create=False)

    def _collection(self, team_id: str, *, create: bool) -> str | None:
        """The team's logical collection, checked and loaded; ``None`` if it does not exist
        and ``create`` is false."""
        name = self.collection_for(team_id)
        if name in self._open:
            return name
        with self._open_lock:
            if name in self._open:
                return name
            if not self.conn.call("has collection", "has_collection", name):
                if not create:
                    return None
                self._create(name)
            else:
                self.shapes.check_dim(name)
            # Milvus Lite needs an explicit load after a restart (and before any query,
            # such as check_model's read of a row when the version noted no model).
            self.conn.call("load", "load_collection", name)
            self.shapes.check_model(name)
            self._open.add(name)
        return name

    def _create(self, name: str) -> None:
        """Create ``<name>__v1`` and point alias ``name`` at it. Safe against a concurrent
        creator (another replica): "already exists" is fine."""
        self.shapes.create_physical(f"{name}__v1")
        try:
            self.conn.call("create alias", "create_alias", f"{name}__v1", name)
        except BackendUnavailable:
            if not self.conn.call("has collection", "has_collection", name):
                raise

    # --- writes -----------------------------------------------------------------
    def upsert(self, chunks: list[ChunkRecord]) -> int:
        if not chunks:
            return 0
        # Each collection checks its own size (a change of model has two).
        check_vectors(chunks, self.shapes.dims)
        by_team: dict[str, list[ChunkRecord]] = {}
        for chunk in chunks:
            by_team.setdefault(chunk.team_id, []).append(chunk)
        for team_id, team_chunks in by_team.items():
            name = self._collection(team_id, create=True)
            assert name is not None  # create=True makes it
            acl, lexical = self.shapes.has_acl(name), self.shapes.has_lexical(name)
            rows = [chunk_to_row(c, acl=acl, lexical=lexical) for c in team_chunks]
            # Always upsert: a plain insert of an existing pk duplicates rows in real Milvus.
            self.conn.call("upsert", "upsert", name, rows)
            self.changes.record(name, [row["chunk_id"] for row in rows])
            self._unflushed[name] = self._unflushed.get(name, 0) + len(rows)
            limit = self.settings.auto_flush_rows
            if limit and self._unflushed[name] >= limit:
                self._flush(name)
        return len(chunks)

    def lookup(self, team_id: str, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        """``chunk_id → (content_hash, embed_model)`` of the team's stored chunks among
        ``chunk_ids``; primary-key queries only."""
        name = self._collection(team_id, create=False)
        return self.versions.lookup(name, chunk_ids) if name is not None else {}

    def stored_chunks(self, team_id: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        """The team's stored chunks among ``chunk_ids`` with their vectors (by primary key)."""
        name = self._collection(team_id, create=False)
        if name is None or not chunk_ids:
            return []
        return [c for c in self.versions.fetch_rows(name, chunk_ids) if c.team_id == team_id]

    def delete_chunks(self, team_id: str, chunk_ids: list[str]) -> int:
        name = self._collection(team_id, create=False)
        if name is None or not chunk_ids:
            return 0
        self.conn.call("delete", "delete", name, ids=list(chunk_ids))
        self.changes.record(name, list(chunk_ids))
        return len(chunk_ids)

    def delete_stale_chunks(self, team_id: str, doc_type: str, doc_id: str, keep: list[str]) -> int:
        name = self._collection(team_id, create=False)
        if name is None:
            return 0
        expr = doc_expr(team_id, doc_type, doc_id)
        if keep:
            expr += f" and chunk_id not in {milvus_list(keep)}"
        # By primary key, so the change log can name what went.
        rows = self.conn.call("query", "query", name, filter=expr, output_fields=["chunk_id"])
        return self.delete_chunks(team_id, [row["chunk_id"] for row in rows])

    def flush(self, team_id: str | None = None) -> None:
        """Flush one team's collection, or every collection of this base name."""
        if team_id is not None:
            name = self._collection(team_id, create=False)
            if name is not None:
                self._flush(name)
            return
        for name in self.owned_collections()[0]:
            self._flush(name)

    def _flush(self, name: str) -> None:
        self.conn.call("flush", "flush", name)
        self._unflushed[name] = 0

    # --- reads ------------------------------------------------------------------
    def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        name = self._collection(team_id, create=False)
        if name is None:
            return []
        expr = doc_expr(team_id, doc_type, doc_id)
        fields = output_fields(acl=self.shapes.has_acl(name))
        rows = self.conn.call("query", "query", name, filter=expr, output_fields=fields)
        return sorted((row_to_chunk(r) for r in rows), key=lambda c: c.chunk_index)

    def fingerprints(
        self, docs: list[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], list[tuple[str, str, str]]]:
        """Stored ``(chunk_id, content_hash, embed_model)`` per document, few queries."""
        out: dict[tuple[str, str, str], list[tuple[str, str, str]]] = {d: [] for d in docs}
        rows: list[dict[str, Any]] = []
        groups: dict[tuple[str, str], list[str]] = {}
        for team_id, doc_type, doc_id in dict.fromkeys(docs):
            groups.setdefault((team_id, doc_type), []).append(doc_id)
        for (team_id, doc_type), doc_ids in groups.items():
            name = self._collection(team_id, create=False)
            if name is None:
                continue
            for start in range(0, len(doc_ids), 64):
                expr = (
                    f"team_id == {milvus_literal(team_id)} and "
                    f"doc_type == {milvus_literal(doc_type)} and "
                    f"doc_id in {milvus_list(doc_ids[start : start + 64])}"
                )
                rows += self.conn.call(
                    "query",
                    "query",
                    name,
                    filter=expr,
                    output_fields=[
                        "team_id",
                        "doc_type",
                        "doc_id",
                        "chunk_id",
                        "chunk_index",
                        "content_hash",
                        "embed_model",
                    ],
                )
        for row in sorted(rows, key=lambda r: int(r["chunk_index"])):
            key = (row["team_id"], row["doc_type"], row["doc_id"])
            if key in out:
                out[key].append((row["chunk_id"], row["content_hash"], row["embed_model"]))
        return out

    def live_model(self, team_id: str) -> str | None:
        """The model tag of the version the team's alias names now (``None``: none yet)."""
        physical = self.versions.live_physical(team_id)
        return None if physical is None else self.shapes.model_of(physical)

    def count(self, team_id: str) -> int:
        name = self._collection(team_id, create=False)
        if name is None:
            return 0
        rows = self.conn.call(
            "count",
            "query",
            name,
            filter=f"team_id == {milvus_literal(team_id)}",
            output_fields=["count(*)"],
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def count_all(self) -> int:
        """Rows in every collection of this base name (benchmarks, operators)."""
        total = 0
        for name in self.owned_collections()[0]:
            rows = self.conn.call("count", "query", name, filter="", output_fields=["count(*)"])
            total += int(rows[0]["count(*)"]) if rows else 0
        return total

    def search(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        mode: str = "dense",
        query_lexical: Mapping[int, float] | None = None,
        *,
        physical: str | None = None,
        strict: bool = False,
    ) -> list[SearchHit]:
        """Top ``limit`` chunks inside ``flt``, searched in the filter's team collection only.

        ``mode``: ``dense`` (vector), ``bm25`` (Milvus full-text) or ``lexical`` (the
        learned sparse weights, ``query_lexical``, by inner product; nothing in a collection
        built without them). Scores are "higher is better". The gateway fuses the lists
        itself (serve_app/search/ranking.py); Milvus's own RRF fusion is
        ``baseline.hybrid_search``, a benchmark baseline.

        ``physical``: search this version of the team's collection (by its physical name)
        rather than whatever the alias names when the call arrives, so that the calls of one
        search read one version across a reindex swap (``memindex.pins``). If that version
        is gone (dropped after the swap), the alias answers, unless ``strict`` (the query
        vector was chosen for that version's model: the alias may name another model's).
        """
        if mode not in SEARCH_METHODS:
            raise InvalidInput(f"mode must be one of {', '.join(SEARCH_METHODS)}, got {mode!r}")
        if mode == "dense" and query_vector is None:
            raise InvalidInput("mode 'dense' needs a query vector")
        if mode == "lexical" and query_lexical is None:
            raise InvalidInput("mode 'lexical' needs the query's learned sparse weights")
        # The team term stays in the expression even inside a per-team collection.
        compiled = compile_filter(flt)
        args = (query_text, query_vector, compiled, limit, mode, query_lexical)
        name = self._collection(flt.team_id, create=False)
        if name is None:
            return []
        if physical is not None:
            try:
                self._load_physical(physical)
                return self._search_in(physical, *args)
            except BackendUnavailable as exc:
                if strict:
                    raise
                logger.info("search of %s failed (%s); searching the alias", physical, exc)
        return self._search_in(name, *args)

    def _load_physical(self, physical: str) -> None:
        """Load one physical version once per connection (a server restart unloads it)."""
        if physical not in self._open:
            self.conn.call("load", "load_collection", physical)
            self._open.add(physical)

    def _search_in(
        self,
        name: str,
        query_text: str,
        query_vector: list[float] | None,
        compiled: CompiledFilter,
        limit: int,
        mode: str,
        query_lexical: Mapping[int, float] | None,
    ) -> list[SearchHit]:
        acl = self.shapes.has_acl(name)
        expr = compiled.milvus_expr(acl=acl)
        data: list[Any]
        if mode == "dense":
            data, field, params = [query_vector], "dense", self.dense_params(limit)
        elif mode == "bm25":
            data, field, params = [query_text], "sparse", BM25_PARAMS
        else:
            weights = {int(t): float(w) for t, w in (query_lexical or {}).items() if w > 0}
            if not weights or not self.shapes.has_lexical(name):
                return []
            data, field, params = [weights], "lexical", {"metric_type": "IP"}
        result = self.conn.call(
            "search",
            "search",
            name,
            data=data,
            anns_field=field,
            filter=expr,
            limit=limit,
            search_params=params,
            output_fields=output_fields(acl=acl),
        )
        return hits_of(result, mode)

    def dense_params(self, limit: int) -> dict[str, Any]:
        return {"metric_type": self.settings.metric_type, "params": {"ef": max(64, limit)}}

    def ping(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.conn.start(check=True)  # a round trip even when connected
        return {
            "ready": True,
            "uri": self.settings.uri,
            "collection": self.collection,
            "layout": self.settings.layout,
            "latency_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    def owned_collections(self) -> tuple[list[str], list[str]]:
        """``(aliases, physical collections)`` of chunks that belong to this base name (the
        change log beside them is not one)."""
        base = self.collection

        def owned(name: str) -> bool:
            return name != self.changes.name and (name == base or name.startswith(base + "__"))

        physical = [c for c in self.conn.call("list collections", "list_collections") if owned(c)]
        aliases: list[str] = []
        for name in physical:
            info = self.conn.call("list aliases", "list_aliases", name)
            aliases += [a for a in info.get("aliases", []) if owned(a)]
        return aliases, physical

    def drop(self) -> None:
        """Drop every collection and alias of this base name (tests and benchmarks only)."""
        aliases, physical = self.owned_collections()
        for alias in aliases:
            self.conn.call("drop alias", "drop_alias", alias)
        for name in physical:
            self.conn.call("drop", "drop_collection", name)
        if self.conn.call("has collection", "has_collection", self.changes.name):
            self.conn.call("drop", "drop_collection", self.changes.name)
        self.changes.reset()
        self._open.clear()
        self._unflushed = {}

    def close(self) -> None:
        self.conn.close()
        self._open.clear()


def hits_of(result: Any, mode: str) -> list[SearchHit]:
    """A Milvus search answer as hits, scored higher-is-better."""
    hits = []
    for hit in result[0] if result else []:
        entity = hit.get("entity", hit)
        raw = float(hit["distance"])
        # Milvus Lite returns BM25 scores negated; report them higher-is-better.
        score = abs(raw) if mode == "bm25" else raw
        hits.append(SearchHit(chunk=row_to_chunk(entity), score=score, scores={mode: score}))
    return hits
