"""Chunk store over Milvus: ``MilvusStore`` (sync pymilvus client, run in threads by the
Serve shell): idempotent upserts and deletes recorded in the change log the in-memory index
follows, the reads of a team's stored chunks, and filtered dense/BM25/learned sparse search.
The same code talks to the local Milvus Lite server and a Milvus cluster. Beside it:
client.py (the connection), schema.py (the DDL), shapes.py (what each collection holds:
fields, vector size, model), team_collections.py (a team's collection opened, or created,
on first use), search.py (one search of one collection), versions.py (the versions behind a
team's alias, for reindex, and the reads the in-memory index loads from), owned.py (every
collection of the base name at once), rows.py (rows ↔ records) and filter.py (the compiled
tenancy filter)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from deployments.config import MilvusSettings
from deployments.protocols import ChunkRecord, SearchFilter, SearchHit
from deployments.vector_store.client import MilvusConnection
from deployments.vector_store.filter import compile_filter, milvus_list, milvus_literal
from deployments.vector_store.memindex.changes import ChangeLog
from deployments.vector_store.owned import OwnedCollections
from deployments.vector_store.rows import (
    chunk_to_row,
    collection_for,
    doc_expr,
    output_fields,
    row_to_chunk,
)
from deployments.vector_store.search import CollectionSearch, check_search
from deployments.vector_store.shapes import CollectionShapes, check_vectors
from deployments.vector_store.team_collections import TeamCollections
from deployments.vector_store.versions import CollectionVersions


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
        self._unflushed: dict[str, int] = {}
        # Every write of a live collection is recorded here, so the in-memory indexes of all
        # Retriever replicas see it (deployments/vector_store/memindex/changes.py).
        self.changes = ChangeLog(
            settings.collection, self.conn.call, retention_s=settings.memory_index.retention_s
        )
        self.conn.on_reset(self._forget_connection)
        self.owned = OwnedCollections(self.conn, settings.collection, not_owned=self.changes.name)
        self.shapes = CollectionShapes(
            self.conn,
            settings,
            dim,
            lexical=lexical,
            embed_model=embed_model,
            dims=dims,
            served=served,
        )
        self.teams = TeamCollections(self.conn, self.shapes, alias_for=self.collection_for)
        self.searcher = CollectionSearch(
            self.conn, settings, self.shapes, load=self.teams.load_physical
        )
        self.versions = CollectionVersions(
            self.conn,
            self.shapes,
            alias_for=self.collection_for,
            changes=self.changes,
            on_switch=self._switched,
        )

    def _switched(self, alias: str) -> None:
        self.teams.forget(alias)
        self.shapes.forget(alias)

    def _forget_connection(self) -> None:
        # A new connection may face a restarted server: load collections again.
        self.teams.forget()
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
            name = self.teams.open(team_id, create=True)
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
        name = self.teams.open(team_id)
        return self.versions.lookup(name, chunk_ids) if name is not None else {}

    def stored_chunks(self, team_id: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        """The team's stored chunks among ``chunk_ids`` with their vectors (by primary key)."""
        name = self.teams.open(team_id)
        if name is None or not chunk_ids:
            return []
        return [c for c in self.versions.fetch_rows(name, chunk_ids) if c.team_id == team_id]

    def delete_chunks(self, team_id: str, chunk_ids: list[str]) -> int:
        name = self.teams.open(team_id)
        if name is None or not chunk_ids:
            return 0
        self.conn.call("delete", "delete", name, ids=list(chunk_ids))
        self.changes.record(name, list(chunk_ids))
        return len(chunk_ids)

    def delete_stale_chunks(self, team_id: str, doc_type: str, doc_id: str, keep: list[str]) -> int:
        name = self.teams.open(team_id)
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
            name = self.teams.open(team_id)
            if name is not None:
                self._flush(name)
            return
        for name in self.owned.names()[0]:
            self._flush(name)

    def _flush(self, name: str) -> None:
        self.conn.call("flush", "flush", name)
        self._unflushed[name] = 0

    # --- reads ------------------------------------------------------------------
    def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        name = self.teams.open(team_id)
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
            name = self.teams.open(team_id)
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
        name = self.teams.open(team_id)
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
        ``baseline.hybrid_search``, a benchmark baseline. ``physical``, ``strict``: the
        version of the team's collection to read (``CollectionSearch.search``).
        """
        check_search(mode, query_vector, query_lexical)
        # The team term stays in the expression even inside a per-team collection.
        compiled = compile_filter(flt)
        name = self.teams.open(flt.team_id)
        if name is None:
            return []
        return self.searcher.search(
            name,
            query_text,
            query_vector,
            compiled,
            limit,
            mode,
            query_lexical,
            physical=physical,
            strict=strict,
        )

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

    def drop(self) -> None:
        """Drop every collection and alias of this base name, and the change log (tests and
        benchmarks only)."""
        self.owned.drop()
        if self.conn.call("has collection", "has_collection", self.changes.name):
            self.conn.call("drop", "drop_collection", self.changes.name)
        self.changes.reset()
        self.teams.forget()
        self._unflushed = {}

    def close(self) -> None:
        self.conn.close()
        self.teams.forget()
