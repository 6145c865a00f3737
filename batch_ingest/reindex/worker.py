"""The reindex worker: one per Ray Data actor, or one in-process. Re-chunks a batch of
documents, embeds what the target version lacks and upserts it there."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from batch_ingest.documents import SourceDocument
from batch_ingest.settings import BatchSettings
from batch_ingest.usage import EmbeddingUsage
from deployments.milvus_versions import CollectionVersions
from deployments.protocols import ChunkRecord, Encoded

logger = logging.getLogger(__name__)


def worker_spec(settings: BatchSettings) -> dict[str, Any]:
    """The settings a worker needs, as plain data (no secrets of other sections)."""
    return {
        "embedder": settings.embedder.model_dump(),
        "milvus": settings.milvus.model_dump(),
        "chunking": settings.chunking.model_dump(),
        # The embedding ledger (batch_ingest/usage.py) in the state database.
        "state_url": settings.state.url,
    }


class ReindexWorker:
    """Callable class for ``Dataset.map_batches``: holds the chunker, the model and a Milvus
    connection; each call re-chunks a batch of documents, embeds what the target lacks and
    upserts it into the target physical collection.

    Args:
        spec: ``worker_spec(settings)``.
        physical: the target collection (``<alias>__v<n+1>``).
        check_existing: look chunk ids up in the target first (resume): a document whose
            chunks are all there with the same hash and model is not embedded again.
        versions, embed, builder: injected by tests; built from ``spec`` when ``None``.
        usage: the embedding ledger; from ``spec["state_url"]`` when ``None`` and given.
    """

    def __init__(
        self,
        spec: dict[str, Any],
        physical: str,
        check_existing: bool,
        *,
        versions: CollectionVersions | None = None,
        embed: Callable[[list[str]], Any] | None = None,
        builder: Any = None,
        usage: EmbeddingUsage | None = None,
    ) -> None:
        from batch_ingest.chunks import chunk_builder
        from batch_ingest.settings import ChunkingSettings
        from deployments.config import EmbedderSettings, MilvusSettings

        emb = EmbedderSettings.model_validate(spec["embedder"])
        self.physical = physical
        self.check_existing = check_existing
        self.embed_model = emb.embed_model_tag
        if builder is None:
            builder = chunk_builder(ChunkingSettings.model_validate(spec["chunking"]), emb)
        self.builder = builder
        if embed is None:
            from deployments.embedding import EmbedderCore

            core = EmbedderCore(emb)
            core.start()
            embed = lambda texts: core.encode(texts, "passage")  # noqa: E731
            dim = core.dim or 0
        else:
            dim = None
        self.embed = embed
        if versions is None:
            from deployments.milvus_store import MilvusStore

            store = MilvusStore(
                MilvusSettings.model_validate(spec["milvus"]), dim=dim or 0, lexical=emb.lexical
            )
            store.start()
            versions = store.versions
        self.versions = versions
        if usage is None and spec.get("state_url"):
            import sqlalchemy as sa

            from batch_ingest.sql import resolve_url

            usage = EmbeddingUsage(sa.create_engine(resolve_url(spec["state_url"])))
        self.usage = usage

    def process(self, documents: Iterable[str]) -> list[dict[str, Any]]:
        """Per document: ``{doc_type, doc_id, chunks, embedded}``, in input order."""
        docs = [SourceDocument.model_validate_json(d) for d in documents]
        built = [(doc, self.builder.build_chunks(doc)) for doc in docs]
        found: dict[str, tuple[str, str]] = {}
        if self.check_existing:
            ids = [c.chunk_id for _, chunks in built for c in chunks]
            found = self.versions.lookup(self.physical, ids) if ids else {}
        todo: list[ChunkRecord] = []
        out = []
        for doc, chunks in built:
            present = bool(found) and all(
                found.get(c.chunk_id) == (c.content_hash, c.embed_model) for c in chunks
            )
            if not present:
                todo += chunks
            out.append(
                {
                    "doc_type": doc.doc_type,
                    "doc_id": doc.doc_id,
                    "chunks": len(chunks),
                    "embedded": 0 if present else len(chunks),
                }
            )
        if todo:
            with_vectors = with_embeddings(todo, self.embed([c.text for c in todo]))
            self.versions.upsert(self.physical, with_vectors)
            self._meter(todo)
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


def with_embeddings(chunks: list[ChunkRecord], embedded: Any) -> list[ChunkRecord]:
    """``chunks`` with their vectors from ``embedded``: an ``Encoded`` (dense vectors and,
    from a BGE-M3 embedder, learned sparse weights) or one vector per chunk."""
    rows = embedded.rows() if isinstance(embedded, Encoded) else [(v, None) for v in embedded]
    return [
        replace(c, vector=[float(x) for x in v], lexical=w)
        for c, (v, w) in zip(chunks, rows, strict=True)
    ]
