"""The reindex worker: one per Ray Data actor, or one in-process. Re-chunks a batch of
documents and writes them into the target version, embedding only what no version holds.

A chunk's vector is taken, in this order, from the target (a resumed job, or a catch-up of a
document already written), from the source version the job replaces (same text, chunker and
model: an index or schema migration copies vectors and never loads the model), and only then
from the model, loaded on first need."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from batch_ingest.documents import SourceDocument
from batch_ingest.settings import BatchSettings
from batch_ingest.usage import EmbeddingUsage
from deployments.protocols import ChunkRecord, Encoded
from deployments.vector_store.versions import CollectionVersions

logger = logging.getLogger(__name__)

# Chunk ids per primary-key read of stored vectors.
FETCH_IDS = 256


def worker_spec(settings: BatchSettings) -> dict[str, Any]:
    """The settings a worker needs, as plain data (no secrets of other sections)."""
    return {
        "embedder": settings.embedder.model_dump(),
        # 0: the cores of the node the worker runs on (resolved there).
        "torch_threads": settings.reindex.torch_threads,
        "nice": settings.reindex.nice,
        "idle_priority": settings.reindex.idle_priority,
        "milvus": settings.milvus.model_dump(),
        "chunking": settings.chunking.model_dump(),
        # The embedding ledger (batch_ingest/usage.py) in the state database.
        "state_url": settings.state.url,
    }


class ReindexWorker:
    """Callable class for ``Dataset.map_batches``: holds the chunker, a Milvus connection and
    (once a chunk needs it) the model; each call re-chunks a batch of documents and upserts
    them into the target physical collection.

    Args:
        spec: ``worker_spec(settings)``.
        physical: the target collection (``<alias>__v<n+1>``).
        check_existing: skip a document whose chunks are all in the target already with the
            same hash and model (resume); otherwise every document is written again (its
            metadata may have changed), its vectors reused where stored.
        source: the physical version being replaced (vectors to copy); ``None``: none.
        versions, embed, builder: injected by tests; built from ``spec`` when ``None``
            (``embed`` lazily, on the first chunk no version holds).
        usage: the embedding ledger; from ``spec["state_url"]`` when ``None`` and given.
    """

    def __init__(
        self,
        spec: dict[str, Any],
        physical: str,
        check_existing: bool,
        source: str | None = None,
        *,
        versions: CollectionVersions | None = None,
        embed: Callable[[list[str]], Any] | None = None,
        builder: Any = None,
        usage: EmbeddingUsage | None = None,
    ) -> None:
        from batch_ingest.chunks import chunk_builder
        from batch_ingest.settings import ChunkingSettings
        from deployments.config import EmbedderSettings, MilvusSettings, node_threads

        emb = EmbedderSettings.model_validate(spec["embedder"])
        threads = node_threads(spec.get("torch_threads", emb.torch_threads))
        emb = emb.model_copy(update={"torch_threads": threads})
        self.settings = emb
        self.physical = physical
        self.source = source
        self.check_existing = check_existing
        self.embed_model = emb.embed_model_tag
        if builder is None:
            builder = chunk_builder(ChunkingSettings.model_validate(spec["chunking"]), emb)
        self.builder = builder
        self._embed = embed
        if versions is None:
            from deployments.models.embedding import embedding_dim
            from deployments.vector_store.store import MilvusStore

            store = MilvusStore(
                MilvusSettings.model_validate(spec["milvus"]),
                dim=embedding_dim(emb),
                lexical=emb.lexical,
            )
            store.start()
            versions = store.versions
        self.versions = versions
        if usage is None and spec.get("state_url"):
            import sqlalchemy as sa

            from batch_ingest.sql import resolve_url

            usage = EmbeddingUsage(sa.create_engine(resolve_url(spec["state_url"])))
        self.usage = usage
        # Chunks of the last call that needed the model when ``embed`` was not allowed.
        self.deferred: list[tuple[str, str]] = []

    def load_model(self) -> Callable[[list[str]], Any]:
        """The embedding function, the model loaded on the first call."""
        if self._embed is None:
            from deployments.models.embedding import EmbedderCore

            core = EmbedderCore(self.settings)
            core.start()
            self._embed = lambda texts: core.encode(texts, "passage")
        return self._embed

    def embed(self, texts: list[str]) -> Any:
        return self.load_model()(texts)

    @property
    def model_loaded(self) -> bool:
        return self._embed is not None

    def process(
        self, documents: Iterable[str], *, allow_embed: bool = True
    ) -> list[dict[str, Any]]:
        """Per document: ``{doc_type, doc_id, chunks, embedded}``, in input order.

        With ``allow_embed=False`` a document with a chunk no version holds is not written:
        its chunks are removed from the target and its key is in ``self.deferred`` (the
        caller embeds it later); it reports ``chunks=0``."""
        docs = [SourceDocument.model_validate_json(d) for d in documents]
        built = [(doc, self.builder.build_chunks(doc)) for doc in docs]
        self.deferred = []
        ids = [c.chunk_id for _, chunks in built for c in chunks]
        found: dict[str, tuple[str, str]] = {}
        if self.check_existing and ids:
            found = self.versions.lookup(self.physical, ids)
        wanted = [c for doc, chunks in built if not _all_present(chunks, found) for c in chunks]
        stored = self._stored_vectors(wanted)
        todo: list[ChunkRecord] = []
        ready: list[ChunkRecord] = []
        drop: list[str] = []
        out = []
        for doc, chunks in built:
            row = {"doc_type": doc.doc_type, "doc_id": doc.doc_id, "chunks": len(chunks)}
            if _all_present(chunks, found):
                out.append({**row, "embedded": 0})
                continue
            missing = [c for c in chunks if c.chunk_id not in stored]
            if missing and not allow_embed:
                self.deferred.append((doc.doc_type, doc.doc_id))
                drop += [c.chunk_id for c in chunks]
                out.append({**row, "chunks": 0, "embedded": 0})
                continue
            ready += [_with(c, stored[c.chunk_id]) for c in chunks if c.chunk_id in stored]
            todo += missing
            out.append({**row, "embedded": len(missing)})
        if todo:
            ready += with_embeddings(todo, self.embed([c.text for c in todo]))
            self._meter(todo)
        if ready:
            self.versions.upsert(self.physical, ready)
        if drop:
            self.versions.delete(self.physical, drop)
        return out

    def _stored_vectors(
        self, chunks: list[ChunkRecord], from_target: bool = True
    ) -> dict[str, tuple[Any, Any]]:
        """``chunk_id → (vector, lexical)`` of ``chunks`` stored with the same text hash and
        model in the target (``from_target``), else in the source version (primary-key
        reads)."""
        out: dict[str, tuple[Any, Any]] = {}
        for physical in (self.physical if from_target else None, self.source):
            left = {c.chunk_id: c for c in chunks if c.chunk_id not in out}
            if physical is None or not left:
                continue
            keys = list(left)
            for start in range(0, len(keys), FETCH_IDS):
                for old in self.versions.fetch_rows(physical, keys[start : start + FETCH_IDS]):
                    new = left.get(old.chunk_id)
                    if (
                        new is not None
                        and old.content_hash == new.content_hash
                        and old.embed_model == new.embed_model
                        and len(old.vector)
                    ):
                        out[old.chunk_id] = (old.vector, old.lexical)
        return out

    def _meter(self, embedded: list[ChunkRecord]) -> None:
        """Record the tokens embedded per team in the ledger (source ``reindex``)."""
        count = getattr(getattr(self.builder, "chunker", None), "count", None)
        if self.usage is None or count is None:
            return
        by_team: dict[str, tuple[int, int]] = {}
        for c in embedded:
            tokens, n = by_team.get(c.team_id, (0, 0))
            by_team[c.team_id] = (tokens + count(c.text), n + 1)
        try:
            self.usage.add("reindex", by_team)
        except Exception as exc:  # the batch is written; the ledger lags
            logger.warning("embedding ledger not updated: %s", exc)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        rows = self.process([str(d) for d in batch["document"]])
        return {key: [r[key] for r in rows] for key in ("doc_type", "doc_id", "chunks", "embedded")}


def _all_present(chunks: list[ChunkRecord], found: dict[str, tuple[str, str]]) -> bool:
    return bool(found) and all(
        found.get(c.chunk_id) == (c.content_hash, c.embed_model) for c in chunks
    )


def _with(chunk: ChunkRecord, stored: tuple[Any, Any]) -> ChunkRecord:
    vector, lexical = stored
    return replace(chunk, vector=[float(x) for x in vector], lexical=lexical)


def with_embeddings(chunks: list[ChunkRecord], embedded: Any) -> list[ChunkRecord]:
    """``chunks`` with their vectors from ``embedded``: an ``Encoded`` (dense vectors and,
    from a BGE-M3 embedder, learned sparse weights) or one vector per chunk."""
    rows = embedded.rows() if isinstance(embedded, Encoded) else [(v, None) for v in embedded]
    return [_with(c, (v, w)) for c, (v, w) in zip(chunks, rows, strict=True)]
