"""Chunk store over Milvus: schema, idempotent upserts, filtered dense/BM25/hybrid search.

``MilvusStore`` is the core class (sync pymilvus client run in threads); ``RetrieverDeployment``
is its Serve shell. The same code talks to the local Milvus Lite server and a Milvus cluster.
Every filter value is written as an escaped JSON string literal (``milvus_literal``): Milvus
Lite does not support ``filter_params`` templates, and an id or tag containing quotes or
operators must never change the expression.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import ChunkRecord, SearchFilter, SearchHit

logger = logging.getLogger(__name__)

# Field sizes of the chunk schema; ingestion validates against the same numbers.
MAX_ID = 256
MAX_TITLE = 1024
MAX_URL = 2048
MAX_TEXT = 16384
MAX_TAGS = 64
MAX_TAG = 128
SEARCH_MODES = ("hybrid", "dense", "bm25")

OUTPUT_FIELDS = [
    "chunk_id",
    "doc_id",
    "team_id",
    "project_id",
    "channel_id",
    "agent_id",
    "visibility",
    "doc_type",
    "tags",
    "created_at",
    "title",
    "heading",
    "url",
    "text",
    "chunk_index",
    "content_hash",
    "embed_model",
]


def milvus_literal(value: str | int | float | bool) -> str:
    """A Milvus expression literal for ``value`` that cannot break out of its quotes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if not isinstance(value, str):
        raise InvalidInput(f"filter value must be a string, got {type(value).__name__}")
    if any(ord(ch) < 32 for ch in value):
        raise InvalidInput("filter values may not contain control characters")
    return json.dumps(value, ensure_ascii=False)


def milvus_list(values: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(milvus_literal(v) for v in values) + "]"


def build_filter_expr(flt: SearchFilter) -> str:
    """Compile a ``SearchFilter`` into one Milvus boolean expression.

    The tenant and visibility terms are always present, so no caller can search without them.
    """
    if not flt.team_id:
        raise InvalidInput("a search needs a team_id")
    if not flt.visibilities:
        raise InvalidInput("a search needs at least one allowed visibility")
    terms = [f"team_id == {milvus_literal(flt.team_id)}"]
    if len(flt.visibilities) == 1:
        terms.append(f"visibility == {milvus_literal(flt.visibilities[0])}")
    else:
        terms.append(f"visibility in {milvus_list(flt.visibilities)}")
    for name in ("project_id", "channel_id", "agent_id"):
        value = getattr(flt, name)
        if value is not None:
            terms.append(f"{name} == {milvus_literal(value)}")
    if flt.doc_types:
        terms.append(f"doc_type in {milvus_list(flt.doc_types)}")
    if flt.tags_any:
        terms.append(f"array_contains_any(tags, {milvus_list(flt.tags_any)})")
    if flt.tags_all:
        terms.append(f"array_contains_all(tags, {milvus_list(flt.tags_all)})")
    if flt.created_from is not None:
        terms.append(f"created_at >= {int(flt.created_from)}")
    if flt.created_to is not None:
        terms.append(f"created_at <= {int(flt.created_to)}")
    return " and ".join(terms)


def _doc_expr(team_id: str, doc_type: str, doc_id: str) -> str:
    return (
        f"team_id == {milvus_literal(team_id)} and doc_type == {milvus_literal(doc_type)} "
        f"and doc_id == {milvus_literal(doc_id)}"
    )


def chunk_to_row(chunk: ChunkRecord) -> dict[str, Any]:
    return {
        "chunk_id": chunk.chunk_id,
        "doc_id": chunk.doc_id,
        "team_id": chunk.team_id,
        "project_id": chunk.project_id,
        "channel_id": chunk.channel_id,
        "agent_id": chunk.agent_id,
        "visibility": chunk.visibility,
        "doc_type": chunk.doc_type,
        "tags": list(chunk.tags),
        "created_at": int(chunk.created_at),
        "title": chunk.title,
        "heading": chunk.heading,
        "url": chunk.url,
        "text": chunk.text,
        "chunk_index": int(chunk.chunk_index),
        "content_hash": chunk.content_hash,
        "embed_model": chunk.embed_model,
        "dense": [float(x) for x in chunk.vector],
    }


def row_to_chunk(row: dict[str, Any]) -> ChunkRecord:
    return ChunkRecord(
        chunk_id=row["chunk_id"],
        doc_id=row["doc_id"],
        team_id=row["team_id"],
        chunk_index=int(row["chunk_index"]),
        text=row["text"],
        title=row["title"],
        content_hash=row["content_hash"],
        embed_model=row["embed_model"],
        visibility=row["visibility"],
        doc_type=row["doc_type"],
        project_id=row["project_id"],
        channel_id=row["channel_id"],
        agent_id=row["agent_id"],
        url=row["url"],
        tags=tuple(row.get("tags") or ()),
        created_at=int(row["created_at"]),
        heading=row.get("heading", ""),
    )


class MilvusStore:
    """The chunk collection in Milvus.

    Args:
        settings: URI, credentials, collection name and index choice.
        dim: dense vector size; must match the embedder.
    """

    def __init__(self, settings: MilvusSettings, *, dim: int) -> None:
        self.settings = settings
        self.dim = dim
        self._client: Any = None
        self._ready = False
        self._unflushed = 0
        self._lock = threading.Lock()

    @property
    def collection(self) -> str:
        return self.settings.collection

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
        """Connect and create the collection with its indexes if missing; idempotent."""
        with self._lock:
            if self._ready:
                return
            try:
                if self._client is None:
                    self._client = self._connect()
                self._ensure_collection()
            except Exception as exc:
                self._client = None
                raise BackendUnavailable(
                    "milvus",
                    f"cannot reach {self.settings.uri}: {exc}",
                    hint="start it with `python scripts/services.py up` or set MILVUS__URI",
                ) from exc
            self._ready = True

    def _ensure_collection(self) -> None:
        from pymilvus import DataType, Function, FunctionType

        client = self._client
        name = self.collection
        if not client.has_collection(name):
            schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
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
            index = client.prepare_index_params()
            dense_params = (
                {"M": 16, "efConstruction": 200} if self.settings.index_type == "HNSW" else {}
            )
            index.add_index(
                "dense",
                index_type=self.settings.index_type,
                metric_type=self.settings.metric_type,
                params=dense_params,
            )
            index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
            for scalar in ("doc_id", "visibility", "doc_type"):
                index.add_index(scalar, index_type="INVERTED")
            client.create_collection(name, schema=schema, index_params=index)
            logger.info("created Milvus collection %s (dim=%d)", name, self.dim)
        else:
            existing = self._collection_dim()
            if existing is not None and existing != self.dim:
                raise InvalidInput(
                    f"collection {name!r} holds {existing}-d vectors but the embedder makes "
                    f"{self.dim}-d ones; reindex into a new collection or point MILVUS__COLLECTION "
                    "elsewhere"
                )
        # Milvus Lite needs an explicit load after a restart.
        client.load_collection(name)

    def _collection_dim(self) -> int | None:
        info = self._client.describe_collection(self.collection)
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
                self._drop_client()
                if attempt == 2:
                    raise BackendUnavailable("milvus", f"{what} failed: {exc}") from exc
                logger.warning("milvus %s failed (%s); reconnecting and retrying once", what, exc)
        raise AssertionError("unreachable")

    def _drop_client(self) -> None:
        with self._lock:
            client, self._client, self._ready = self._client, None, False
        if client is not None:
            try:
                client.close()
            except Exception:  # already broken
                logger.debug("closing a broken Milvus client failed", exc_info=True)

    # --- writes -----------------------------------------------------------------
    def upsert(self, chunks: list[ChunkRecord]) -> int:
        if not chunks:
            return 0
        for chunk in chunks:
            if len(chunk.vector) != self.dim:
                raise InvalidInput(
                    f"chunk {chunk.chunk_id} has a {len(chunk.vector)}-d vector, "
                    f"expected {self.dim}"
                )
        rows = [chunk_to_row(c) for c in chunks]
        # Always upsert: a plain insert of an existing pk duplicates rows in real Milvus.
        self._call("upsert", "upsert", self.collection, rows)
        self._unflushed += len(rows)
        limit = self.settings.auto_flush_rows
        if limit and self._unflushed >= limit:
            self.flush()
        return len(rows)

    def lookup(self, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        for start in range(0, len(chunk_ids), 256):
            rows = self._call(
                "lookup",
                "query",
                self.collection,
                filter=f"chunk_id in {milvus_list(chunk_ids[start : start + 256])}",
                output_fields=["chunk_id", "content_hash", "embed_model"],
            )
            for row in rows:
                out[row["chunk_id"]] = (row["content_hash"], row["embed_model"])
        return out

    def delete_chunks(self, chunk_ids: list[str]) -> int:
        if not chunk_ids:
            return 0
        self._call("delete", "delete", self.collection, ids=list(chunk_ids))
        return len(chunk_ids)

    def delete_stale_chunks(self, team_id: str, doc_type: str, doc_id: str, keep: list[str]) -> int:
        expr = _doc_expr(team_id, doc_type, doc_id)
        if keep:
            expr += f" and chunk_id not in {milvus_list(keep)}"
        result = self._call("delete", "delete", self.collection, filter=expr)
        return _deleted_count(result)

    def flush(self) -> None:
        self._call("flush", "flush", self.collection)
        self._unflushed = 0

    # --- reads ------------------------------------------------------------------
    def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        expr = _doc_expr(team_id, doc_type, doc_id)
        rows = self._call(
            "query", "query", self.collection, filter=expr, output_fields=OUTPUT_FIELDS
        )
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
            for start in range(0, len(doc_ids), 64):
                expr = (
                    f"team_id == {milvus_literal(team_id)} and "
                    f"doc_type == {milvus_literal(doc_type)} and "
                    f"doc_id in {milvus_list(doc_ids[start : start + 64])}"
                )
                rows += self._call(
                    "query",
                    "query",
                    self.collection,
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

    def count(self, team_id: str | None = None) -> int:
        expr = f"team_id == {milvus_literal(team_id)}" if team_id else ""
        rows = self._call(
            "count",
            "query",
            self.collection,
            filter=expr,
            output_fields=["count(*)"],
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def search(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        mode: str = "hybrid",
        rrf_k: int = 60,
    ) -> list[SearchHit]:
        """Top ``limit`` chunks inside ``flt``.

        ``mode``: ``dense`` (vector only), ``bm25`` (Milvus full-text only) or ``hybrid``
        (both, fused by Milvus's RRF ranker). Scores are "higher is better" in every mode.
        """
        if mode not in SEARCH_MODES:
            raise InvalidInput(f"mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if mode != "bm25" and query_vector is None:
            raise InvalidInput(f"mode {mode!r} needs a query vector")
        expr = build_filter_expr(flt)
        dense_param = {"metric_type": self.settings.metric_type, "params": {"ef": max(64, limit)}}
        bm25_param = {"metric_type": "BM25"}
        if mode == "dense":
            result = self._call(
                "search",
                "search",
                self.collection,
                data=[query_vector],
                anns_field="dense",
                filter=expr,
                limit=limit,
                search_params=dense_param,
                output_fields=OUTPUT_FIELDS,
            )
        elif mode == "bm25":
            result = self._call(
                "search",
                "search",
                self.collection,
                data=[query_text],
                anns_field="sparse",
                filter=expr,
                limit=limit,
                search_params=bm25_param,
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
                self.collection,
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
        self.start()
        self._call("ping", "has_collection", self.collection)
        return {
            "ready": True,
            "uri": self.settings.uri,
            "collection": self.collection,
            "latency_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    def drop(self) -> None:
        """Drop the collection (tests and benchmarks only)."""
        self.start()
        self._client.drop_collection(self.collection)
        self._ready = False

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
            self._ready = False


def _deleted_count(result: Any) -> int:
    # Milvus returns {"delete_count": n}; Milvus Lite returns the deleted pks as a list.
    if isinstance(result, dict):
        count = result.get("delete_count", 0)
        return len(count) if isinstance(count, list) else int(count)
    if isinstance(result, list):
        return len(result)
    return int(getattr(result, "delete_count", 0) or 0)


class RetrieverDeployment:
    """Serve shell over ``MilvusStore``; every blocking client call runs in a thread."""

    def __init__(self, settings: MilvusSettings, dim: int, rrf_k: int = 60) -> None:
        self.store = MilvusStore(settings, dim=dim)
        self.rrf_k = rrf_k

    async def upsert(self, chunks: list[ChunkRecord]) -> int:
        return await asyncio.to_thread(self.store.upsert, chunks)

    async def delete_chunks(self, chunk_ids: list[str]) -> int:
        return await asyncio.to_thread(self.store.delete_chunks, chunk_ids)

    async def lookup(self, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        return await asyncio.to_thread(self.store.lookup, chunk_ids)

    async def delete_stale_chunks(
        self, team_id: str, doc_type: str, doc_id: str, keep: list[str]
    ) -> int:
        return await asyncio.to_thread(
            self.store.delete_stale_chunks, team_id, doc_type, doc_id, keep
        )

    async def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        return await asyncio.to_thread(self.store.get_chunks, team_id, doc_type, doc_id)

    async def fingerprints(
        self, docs: list[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], list[tuple[str, str, str]]]:
        return await asyncio.to_thread(self.store.fingerprints, docs)

    async def search(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        mode: str,
    ) -> list[SearchHit]:
        return await asyncio.to_thread(
            self.store.search, query_text, query_vector, flt, limit, mode, self.rrf_k
        )

    async def candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        methods: tuple[str, ...],
    ) -> dict[str, list[SearchHit]]:
        # The single-method searches run concurrently; fusion happens in the ingress.
        results = await asyncio.gather(
            *(
                asyncio.to_thread(self.store.search, query_text, query_vector, flt, limit, m)
                for m in methods
            )
        )
        return dict(zip(methods, results, strict=True))

    async def count(self, team_id: str | None = None) -> int:
        return await asyncio.to_thread(self.store.count, team_id)

    async def flush(self) -> None:
        await asyncio.to_thread(self.store.flush)

    async def status(self) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(self.store.ping)
        except Exception as exc:
            return {"ready": False, "uri": self.store.settings.uri, "error": str(exc)}
