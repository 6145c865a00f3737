"""The vectors of the chunks an ingestion writes: those stored already for the same text and
model are read back, the rest are embedded, in slices of whole documents so that the
pipeline (batch_ingest/pipeline.py) writes one slice while the embedder works on the next."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from batch_ingest.documents import SourceDocument
from deployments.errors import GatewayError
from deployments.protocols import ChunkRecord, Embedder, VectorStore

logger = logging.getLogger(__name__)

# Chunks per embedding call and per upsert call. Between Serve replicas a call's request and
# answer travel as one gRPC message of at most 4 MiB: a 1.95 M-character document is ~3,400
# chunks, 5.2 MB of float32 vectors at 384 dimensions in one answer, and the embedder's
# reply failed with RESOURCE_EXHAUSTED (the job retried for ever). 256 chunks with their
# vectors are ~1.2 MB at 384 dimensions, ~2.6 MB at 1,024 (bge-m3).
CALL_MAX_CHUNKS = 256

# A chunk's dense vector and its learned sparse weights (``None``: the embedder makes none).
Embedding = tuple[Sequence[float] | np.ndarray, Mapping[int, float] | None]
Planned = list[tuple[SourceDocument, list[ChunkRecord]]]


@dataclass
class Slice:
    """Consecutive documents to write together, and those of their chunks to embed (at most
    ``CALL_MAX_CHUNKS`` unless one document alone has more)."""

    docs: Planned = field(default_factory=list)
    to_embed: list[ChunkRecord] = field(default_factory=list)


def slices(planned: Planned, kept: Mapping[str, Embedding], size: int) -> list[Slice]:
    """``planned`` cut, in order and never inside a document, into slices of about ``size``
    chunks to embed each."""
    out: list[Slice] = []
    current = Slice()
    for doc, chunks in planned:
        fresh = [c for c in chunks if c.chunk_id not in kept]
        if current.docs and len(current.to_embed) + len(fresh) > size:
            out.append(current)
            current = Slice()
        current.docs.append((doc, chunks))
        current.to_embed.extend(fresh)
    if current.docs:
        out.append(current)
    return out


class PassageVectors:
    """Reads back and makes passage vectors.

    Args:
        embedder: makes passage vectors (``model=`` names a model other than the primary).
        store: the chunk collection (stored vectors are read back from it).
        embed_model: the primary model's tag.
        lexical: the embedder makes learned sparse weights too (``encode``).
    """

    def __init__(
        self, embedder: Embedder, store: VectorStore, embed_model: str, lexical: bool
    ) -> None:
        self.embedder = embedder
        self.store = store
        self.embed_model = embed_model
        self.lexical = lexical

    async def stored(
        self, planned: Planned, found: Mapping[str, tuple[str, str]]
    ) -> dict[str, Embedding]:
        """``chunk_id → (vector, learned sparse weights)`` of the planned chunks stored with
        the same text and model (primary-key reads of those already stored only; a store
        that cannot read them back costs an embedding, never the write)."""
        wanted: dict[str, dict[str, ChunkRecord]] = {}
        for _, chunks in planned:
            for c in chunks:
                if c.chunk_id in found and found[c.chunk_id][1] == c.embed_model:
                    wanted.setdefault(c.team_id, {})[c.chunk_id] = c
        kept: dict[str, Embedding] = {}
        for team_id, chunks_by_id in wanted.items():
            try:
                stored = await self.store.stored_chunks(team_id, list(chunks_by_id))
            except GatewayError as exc:
                logger.warning("stored vectors of team %s not read (embedding): %s", team_id, exc)
                continue
            for old in stored:
                new = chunks_by_id.get(old.chunk_id)
                if (
                    new is not None
                    and old.text == new.text
                    and old.embed_model == new.embed_model
                    and len(old.vector)
                ):
                    kept[old.chunk_id] = (old.vector, old.lexical)
        return kept

    async def embed(self, chunks: list[ChunkRecord]) -> dict[str, Embedding]:
        """``chunk_id → (vector, learned sparse weights)``, each chunk by the model its
        ``embed_model`` names."""
        by_model: dict[str, list[ChunkRecord]] = {}
        for c in chunks:
            by_model.setdefault(c.embed_model, []).append(c)
        out: dict[str, Embedding] = {}
        for tag, group in by_model.items():
            # The primary model is asked for without naming it (any Embedder answers).
            more = {} if tag == self.embed_model else {"model": tag}
            rows = await self._embed_texts([c.text for c in group], more)
            out.update(zip((c.chunk_id for c in group), rows, strict=True))
        return out

    async def _embed_texts(self, texts: list[str], more: dict[str, str]) -> list[Embedding]:
        """In calls of at most ``CALL_MAX_CHUNKS`` texts, sent together (the embedder
        batches them all, and no answer outgrows Ray's 4 MiB message between replicas)."""
        calls = range(0, len(texts), CALL_MAX_CHUNKS)
        if not self.lexical:
            parts = await asyncio.gather(
                *(
                    self.embedder.embed(texts[i : i + CALL_MAX_CHUNKS], "passage", **more)
                    for i in calls
                )
            )
            return [(v, None) for part in parts for v in part]
        encoded = await asyncio.gather(
            *(
                self.embedder.encode(texts[i : i + CALL_MAX_CHUNKS], "passage", **more)
                for i in calls
            )
        )
        return [row for part in encoded for row in part.rows()]
