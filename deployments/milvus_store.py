"""Chunk store over Milvus: ``MilvusStore`` (sync pymilvus client, run in threads by the
Serve shell): schema, idempotent upserts, filtered dense/BM25/hybrid search, the versioned
collections behind each team's alias, and the change log the in-memory index follows. The
same code talks to the local Milvus Lite server and a Milvus cluster. Filters come compiled
from ``deployments.search_filter`` (escaped literals, tenant terms always present)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.memindex.changes import ChangeLog
from deployments.milvus_rows import (
    OUTPUT_FIELDS,
    SEARCH_MODES,
    chunk_to_row,
    chunk_with_vector,
    collection_for,
    doc_expr,
    row_to_chunk,
)
from deployments.protocols import (
    MAX_ID,
    MAX_TAG,
    MAX_TAGS,
    MAX_TEXT,
    MAX_TITLE,
    MAX_URL,
    ChunkRecord,
    SearchFilter,
    SearchHit,
)
from deployments.search_filter import (
    build_filter_expr,
    milvus_list,
    milvus_literal,
)

logger = logging.getLogger(__name__)


class MilvusStore:
    """The chunk collections in Milvus.

    Every operation names its team; ``collection_for`` maps the team to a logical collection
    name, which is an alias onto a physical, versioned collection (``<name>__v1``), so a
    reindex can build ``__v2`` beside it and swap the alias. Reads of a team that has no
    collection yet return nothing and create nothing.

    Args:
        settings: URI, credentials, base collection name, layout and index choice.
        dim: dense vector size; must match the embedder.
    """

    def __init__(self, settings: MilvusSettings, *, dim: int) -> None:
        self.settings = settings
        self.dim = dim
        self._client: Any = None
        self._ready = False
        self._open: set[str] = set()  # logical names checked and loaded on this connection
        self._unflushed: dict[str, int] = {}
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        # Every write of a live collection is recorded here, so the in-memory indexes of all
        # Retriever replicas see it (deployments/memindex/changes.py).
        self.changes = ChangeLog(
            settings.collection, self._call, retention_s=settings.memory_index.retention_s
        )

    @property
    def collection(self) -> str:
        """The base name; see ``collection_for`` for a team's collection."""
        return self.settings.collection

    def collection_for(self, team_id: str) -> str:
        return collection_for(self.settings, team_id)

    def _connect(self) -> Any:
        from pymilvus import MilvusClient

        kwargs: dict[str, Any] = {
            "uri": self.settings.uri,
            "timeout": self.settings.timeout_s,
            # No keepalive pings on an idle channel: the Milvus Lite server answers them
            # with GOAWAY "too_many_pings" and drops idle replicas' connections.
            "grpc_options": {"grpc.keepalive_permit_without_calls": 0},
        }
        if self.settings.token:
            kwargs["token"] = self.settings.token
        if self.settings.db_name:
            kwargs["db_name"] = self.settings.db_name
        return MilvusClient(**kwargs)

    def start(self) -> None:
        """Connect; idempotent. Collections are opened (and created) per team on first use."""
        with self._lock:
            if self._ready:
                return
            try:
                if self._client is None:
                    self._client = self._connect()
                self._client.list_collections()
            except Exception as exc:
                self._client = None
                raise BackendUnavailable(
                    "milvus",
                    f"cannot reach {self.settings.uri}: {exc}",
                    hint="start it with `python scripts/services.py up` or set MILVUS__URI",
                ) from exc
            self._ready = True

    def _collection(self, team_id: str, *, create: bool) -> str | None:
        """The team's logical collection, checked and loaded; ``None`` if it does not exist
        and ``create`` is false."""
        name = self.collection_for(team_id)
        if name in self._open:
            return name
        with self._open_lock:
            if name in self._open:
                return name
            if not self._call("has collection", "has_collection", name):
                if not create:
                    return None
                self._create(name)
            else:
                existing = self._collection_dim(name)
                if existing is not None and existing != self.dim:
                    raise BackendUnavailable(
                        "milvus",
                        f"collection {name!r} holds {existing}-d vectors but the embedder makes "
                        f"{self.dim}-d ones",
                        hint="reindex the team with the new model or point MILVUS__COLLECTION "
                        "elsewhere",
                    )
            # Milvus Lite needs an explicit load after a restart.
            self._call("load", "load_collection", name)
            self._open.add(name)
        return name

    def _create(self, name: str, version: int = 1) -> str:
        """Create the physical collection ``<name>__v<version>`` and point alias ``name`` at
        it. Safe against a concurrent creator (another replica): "already exists" is fine."""
        physical = f"{name}__v{version}"
        try:
            self._call("create collection", "create_collection", physical, **self._definition())
            logger.info("created Milvus collection %s (dim=%d)", physical, self.dim)
        except BackendUnavailable:
            if not self._call("has collection", "has_collection", physical):
                raise
        try:
            self._call("create alias", "create_alias", physical, name)
        except BackendUnavailable:
            if not self._call("has collection", "has_collection", name):
                raise
        return physical

    def _definition(self) -> dict[str, Any]:
        from pymilvus import DataType, Function, FunctionType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("chunk_id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID)
        schema.add_field("doc_id", DataType.VARCHAR, max_length=MAX_ID)
        schema.add_field("team_id", DataType.VARCHAR, max_length=MAX_ID, is_partition_key=True)
        for field in ("project_id", "channel_id", "agent_id"):
            schema.add_field(field, DataType.VARCHAR, max_length=MAX_ID)
        schema.add_field("visibility", DataType.VARCHAR, max_length=32)
        schema.add_field("doc_type", DataType.VARCHAR, max_length=64)
        schema.add_field(
            "tags",
            DataType.ARRAY,
            element_type=DataType.VARCHAR,
            max_capacity=MAX_TAGS,
            max_length=MAX_TAG,
        )
        schema.add_field("created_at", DataType.INT64)
        schema.add_field("title", DataType.VARCHAR, max_length=MAX_TITLE)
        schema.add_field("heading", DataType.VARCHAR, max_length=MAX_TITLE)
        schema.add_field("url", DataType.VARCHAR, max_length=MAX_URL)
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT, enable_analyzer=True)
        schema.add_field("chunk_index", DataType.INT64)
        schema.add_field("content_hash", DataType.VARCHAR, max_length=128)
        schema.add_field("embed_model", DataType.VARCHAR, max_length=256)
        schema.add_field("dense", DataType.FLOAT_VECTOR, dim=self.dim)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(
            Function(
                name="text_bm25",
                function_type=FunctionType.BM25,
                input_field_names=["text"],
                output_field_names=["sparse"],
            )
        )
        index = MilvusClient.prepare_index_params()
        hnsw = self.settings.index_type == "HNSW"
        dense_params = {"M": 16, "efConstruction": 200} if hnsw else {}
        index.add_index(
            "dense",
            index_type=self.settings.index_type,
            metric_type=self.settings.metric_type,
            params=dense_params,
        )
        # k1 and b explicit: the in-memory index scores with the same ones.
        index.add_index(
            "sparse",
            index_type="SPARSE_INVERTED_INDEX",
            metric_type="BM25",
            params={"bm25_k1": self.settings.bm25_k1, "bm25_b": self.settings.bm25_b},
        )
        for scalar in ("doc_id", "visibility", "doc_type"):
            index.add_index(scalar, index_type="INVERTED")
        # One team per collection needs no partition-key buckets (a Milvus cluster honours
        # this; Milvus Lite ignores it).
        partitions = 1 if self.settings.layout == "collection_per_team" else 16
        return {"schema": schema, "index_params": index, "num_partitions": partitions}

    def _collection_dim(self, name: str) -> int | None:
        info = self._call("describe", "describe_collection", name)
        for field in info.get("fields", []):
            if field.get("name") == "dense":
                return int(field.get("params", {}).get("dim", 0)) or None
        return None

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a client method, connecting first. Every operation here is idempotent, so a
        failure (often a connection the server dropped while idle) is retried once on a
        fresh connection before it becomes ``BackendUnavailable``."""
        for attempt in (1, 2):
            self.start()
            try:
                return getattr(self._client, method)(*args, **kwargs)
            except InvalidInput:
                raise
            except Exception as exc:
                if _already_exists(exc):
                    raise BackendUnavailable("milvus", f"{what} failed: {exc}") from exc
                self._drop_client()
                if attempt == 2:
                    raise BackendUnavailable("milvus", f"{what} failed: {exc}") from exc
                logger.warning("milvus %s failed (%s); reconnecting and retrying once", what, exc)
        raise AssertionError("unreachable")

    def _drop_client(self) -> None:
        with self._lock:
            client, self._client, self._ready = self._client, None, False
            # A new connection may face a restarted server: load collections again.
            self._open = set()
            self.changes.reset()
        if client is not None:
            try:
                client.close()
            except Exception:  # already broken
                logger.debug("closing a broken Milvus client failed", exc_info=True)

    # --- writes -----------------------------------------------------------------
    def upsert(self, chunks: list[ChunkRecord]) -> int:
        if not chunks:
            return 0
        by_team: dict[str, list[dict[str, Any]]] = {}
        for chunk in chunks:
            if len(chunk.vector) != self.dim:
                raise InvalidInput(
                    f"chunk {chunk.chunk_id} has a {len(chunk.vector)}-d vector, "
                    f"expected {self.dim}"
                )
            by_team.setdefault(chunk.team_id, []).append(chunk_to_row(chunk))
        for team_id, rows in by_team.items():
            name = self._collection(team_id, create=True)
            assert name is not None  # create=True makes it
            # Always upsert: a plain insert of an existing pk duplicates rows in real Milvus.
            self._call("upsert", "upsert", name, rows)
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
        return self.lookup_in(name, chunk_ids) if name is not None else {}

    def delete_chunks(self, team_id: str, chunk_ids: list[str]) -> int:
        name = self._collection(team_id, create=False)
        if name is None or not chunk_ids:
            return 0
        self._call("delete", "delete", name, ids=list(chunk_ids))
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
        rows = self._call("query", "query", name, filter=expr, output_fields=["chunk_id"])
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
        self._call("flush", "flush", name)
        self._unflushed[name] = 0

    # --- reads ------------------------------------------------------------------
    def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        name = self._collection(team_id, create=False)
        if name is None:
            return []
        expr = doc_expr(team_id, doc_type, doc_id)
        rows = self._call("query", "query", name, filter=expr, output_fields=OUTPUT_FIELDS)
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
                rows += self._call(
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

    def count(self, team_id: str) -> int:
        name = self._collection(team_id, create=False)
        if name is None:
            return 0
        rows = self._call(
            "count",
            "query",
            name,
            filter=f"team_id == {milvus_literal(team_id)}",
            output_fields=["count(*)"],
        )
        return int(rows[0]["count(*)"]) if rows else 0

    # --- reads of the in-memory index (deployments/memindex) -----------------------------
    def live_physical(self, team_id: str) -> str | None:
        """The physical collection the team's alias names now; ``None`` without one."""
        version = self.current_version(team_id)
        return None if version is None else self.physical_name(team_id, version)

    def count_team(self, physical: str, team_id: str) -> int:
        return self.count_in(physical, f"team_id == {milvus_literal(team_id)}")

    def iter_rows(
        self, physical: str, team_id: str, batch: int = 1000
    ) -> Iterator[list[ChunkRecord]]:
        """Every chunk of ``team_id`` in ``physical``, with its vector, ``batch`` at a time."""
        self.start()
        try:
            iterator = self._client.query_iterator(
                physical,
                batch_size=batch,
                filter=f"team_id == {milvus_literal(team_id)}",
                output_fields=[*OUTPUT_FIELDS, "dense"],
            )
            while rows := iterator.next():
                yield [chunk_with_vector(row) for row in rows]
            iterator.close()
        except Exception as exc:
            raise BackendUnavailable("milvus", f"reading {physical} failed: {exc}") from exc

    def fetch_rows(self, physical: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        """The stored chunks (with vectors) among ``chunk_ids``; primary-key reads."""
        out: list[ChunkRecord] = []
        for start in range(0, len(chunk_ids), 256):
            rows = self._call(
                "fetch",
                "get",
                physical,
                ids=chunk_ids[start : start + 256],
                output_fields=[*OUTPUT_FIELDS, "dense"],
                consistency_level="Strong",
            )
            out += [chunk_with_vector(row) for row in rows]
        return out

    def count_all(self) -> int:
        """Rows in every collection of this base name (benchmarks, operators)."""
        total = 0
        for name in self.owned_collections()[0]:
            rows = self._call("count", "query", name, filter="", output_fields=["count(*)"])
            total += int(rows[0]["count(*)"]) if rows else 0
        return total

    def search(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        mode: str = "hybrid",
        rrf_k: int = 60,
    ) -> list[SearchHit]:
        """Top ``limit`` chunks inside ``flt``, searched in the filter's team collection only.

        ``mode``: ``dense`` (vector only), ``bm25`` (Milvus full-text only) or ``hybrid``
        (both, fused by Milvus's RRF ranker). Scores are "higher is better" in every mode.
        """
        if mode not in SEARCH_MODES:
            raise InvalidInput(f"mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if mode != "bm25" and query_vector is None:
            raise InvalidInput(f"mode {mode!r} needs a query vector")
        # The team term stays in the expression even inside a per-team collection.
        expr = build_filter_expr(flt)
        name = self._collection(flt.team_id, create=False)
        if name is None:
            return []
        dense_param = {"metric_type": self.settings.metric_type, "params": {"ef": max(64, limit)}}
        bm25_param = {"metric_type": "BM25"}
        if mode != "hybrid":
            data, field, params = (
                ([query_vector], "dense", dense_param)
                if mode == "dense"
                else ([query_text], "sparse", bm25_param)
            )
            result = self._call(
                "search",
                "search",
                name,
                data=data,
                anns_field=field,
                filter=expr,
                limit=limit,
                search_params=params,
                output_fields=OUTPUT_FIELDS,
            )
        else:
            from pymilvus import AnnSearchRequest, RRFRanker

            requests = [
                AnnSearchRequest([query_vector], "dense", dense_param, limit, expr=expr),
                AnnSearchRequest([query_text], "sparse", bm25_param, limit, expr=expr),
            ]
            result = self._call(
                "hybrid search",
                "hybrid_search",
                name,
                requests,
                RRFRanker(rrf_k),
                limit=limit,
                output_fields=OUTPUT_FIELDS,
            )
        hits = []
        for hit in result[0] if result else []:
            entity = hit.get("entity", hit)
            raw = float(hit["distance"])
            # Milvus Lite returns BM25 scores negated; report them higher-is-better.
            score = abs(raw) if mode == "bm25" else raw
            hits.append(SearchHit(chunk=row_to_chunk(entity), score=score, scores={mode: score}))
        return hits

    def ping(self) -> dict[str, Any]:
        started = time.perf_counter()
        self._ready = False  # force a round trip
        self.start()
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

        physical = [c for c in self._call("list collections", "list_collections") if owned(c)]
        aliases: list[str] = []
        for name in physical:
            info = self._call("list aliases", "list_aliases", name)
            aliases += [a for a in info.get("aliases", []) if owned(a)]
        return aliases, physical

    # --- versions (reindex: build __v<N+1> beside the live one, then swap the alias) ----
    def physical_name(self, team_id: str, version: int) -> str:
        return f"{self.collection_for(team_id)}__v{int(version)}"

    def current_version(self, team_id: str) -> int | None:
        """The version the team's alias points to; ``None`` when the team has no collection."""
        alias = self.collection_for(team_id)
        if not self._call("has collection", "has_collection", alias):
            return None
        info = self._call("describe alias", "describe_alias", alias)
        target = info.get("collection_name", "") if isinstance(info, dict) else ""
        match = re.fullmatch(re.escape(alias) + r"__v(\d+)", target)
        if match is None:
            raise BackendUnavailable(
                "milvus", f"alias {alias!r} points to {target!r}, not a versioned collection"
            )
        return int(match.group(1))

    def versions(self, team_id: str) -> list[int]:
        """Every physical version of the team's collection that exists, ascending."""
        pattern = re.compile(re.escape(self.collection_for(team_id)) + r"__v(\d+)")
        found = []
        for name in self._call("list collections", "list_collections"):
            match = pattern.fullmatch(name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def create_version(self, team_id: str, version: int) -> str:
        """Create (idempotently) and load the physical collection ``<alias>__v<version>``
        with the same schema and indexes, without pointing the alias at it."""
        physical = self.physical_name(team_id, version)
        if not self._call("has collection", "has_collection", physical):
            try:
                self._call("create collection", "create_collection", physical, **self._definition())
                logger.info("created Milvus collection %s (dim=%d)", physical, self.dim)
            except BackendUnavailable:
                if not self._call("has collection", "has_collection", physical):
                    raise
        existing = self._collection_dim(physical)
        if existing is not None and existing != self.dim:
            raise BackendUnavailable(
                "milvus", f"{physical!r} holds {existing}-d vectors, expected {self.dim}"
            )
        self._call("load", "load_collection", physical)
        return physical

    def upsert_into(self, physical: str, chunks: list[ChunkRecord]) -> int:
        """Upsert chunks into one physical collection (a version being built), by pk."""
        if not chunks:
            return 0
        for chunk in chunks:
            if len(chunk.vector) != self.dim:
                raise InvalidInput(
                    f"chunk {chunk.chunk_id} has a {len(chunk.vector)}-d vector, "
                    f"expected {self.dim}"
                )
        self._call("upsert", "upsert", physical, [chunk_to_row(c) for c in chunks])
        self._record_if_live(physical, [c.chunk_id for c in chunks])
        return len(chunks)

    def lookup_in(self, physical: str, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        """``chunk_id → (content_hash, embed_model)`` in one physical collection (pk only)."""
        out: dict[str, tuple[str, str]] = {}
        for start in range(0, len(chunk_ids), 256):
            rows = self._call(
                "lookup",
                "query",
                physical,
                filter=f"chunk_id in {milvus_list(chunk_ids[start : start + 256])}",
                output_fields=["chunk_id", "content_hash", "embed_model"],
            )
            for row in rows:
                out[row["chunk_id"]] = (row["content_hash"], row["embed_model"])
        return out

    def delete_in(self, physical: str, chunk_ids: list[str]) -> int:
        if not chunk_ids:
            return 0
        self._call("delete", "delete", physical, ids=list(chunk_ids))
        self._record_if_live(physical, list(chunk_ids))
        return len(chunk_ids)

    def _record_if_live(self, physical: str, chunk_ids: list[str]) -> None:
        """Record a write of one physical version in the change log when its alias names it
        (a reindex catching up after the swap); a version being built is nobody's to see."""
        alias, _, version = physical.rpartition("__v")
        if not version.isdigit() or not self._call("has collection", "has_collection", alias):
            return
        info = self._call("describe alias", "describe_alias", alias)
        if isinstance(info, dict) and info.get("collection_name") == physical:
            self.changes.record(alias, chunk_ids)

    def count_in(self, physical: str, expr: str = "") -> int:
        """Rows of one physical collection matching ``expr`` (all rows when empty)."""
        rows = self._call("count", "query", physical, filter=expr, output_fields=["count(*)"])
        return int(rows[0]["count(*)"]) if rows else 0

    def flush_physical(self, physical: str) -> None:
        self._call("flush", "flush", physical)

    def switch_alias(self, team_id: str, version: int) -> str:
        """Point the team's alias at ``<alias>__v<version>`` in one ``alter_alias`` call (or
        create the alias for a team that had none): searches see the old or the new version,
        never a mix. Returns the physical name."""
        alias = self.collection_for(team_id)
        physical = self.physical_name(team_id, version)
        if not self._call("has collection", "has_collection", physical):
            raise InvalidInput(f"collection {physical!r} does not exist")
        if self._call("has collection", "has_collection", alias):
            self._call("alter alias", "alter_alias", physical, alias)
        else:
            self._call("create alias", "create_alias", physical, alias)
        with self._open_lock:
            self._open.discard(alias)
        self.changes.record_swap(alias)
        logger.info("alias %s now points to %s", alias, physical)
        return physical

    def drop_version(self, team_id: str, version: int) -> bool:
        """Drop one physical version; refuses the one the alias points to."""
        if self.current_version(team_id) == version:
            raise InvalidInput(f"version {version} is live; switch the alias first")
        physical = self.physical_name(team_id, version)
        if not self._call("has collection", "has_collection", physical):
            return False
        self._call("drop", "drop_collection", physical)
        self._unflushed.pop(physical, None)
        logger.info("dropped Milvus collection %s", physical)
        return True

    def drop(self) -> None:
        """Drop every collection and alias of this base name (tests and benchmarks only)."""
        aliases, physical = self.owned_collections()
        for alias in aliases:
            self._call("drop alias", "drop_alias", alias)
        for name in physical:
            self._call("drop", "drop_collection", name)
        if self._call("has collection", "has_collection", self.changes.name):
            self._call("drop", "drop_collection", self.changes.name)
        self.changes.reset()
        self._open = set()
        self._unflushed = {}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
            self._ready = False
            self._open = set()


def _already_exists(exc: Exception) -> bool:
    return "already exist" in str(exc).lower()


def _deleted_count(result: Any) -> int:
    # Milvus returns {"delete_count": n}; Milvus Lite returns the deleted pks as a list.
    if isinstance(result, dict):
        count = result.get("delete_count", 0)
        return len(count) if isinstance(count, list) else int(count)
    if isinstance(result, list):
        return len(result)
    return int(getattr(result, "delete_count", 0) or 0)
