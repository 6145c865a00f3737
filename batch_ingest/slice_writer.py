"""The write half of an ingestion (batch_ingest/pipeline.py): documents written slice by
slice as their vectors come back from the embedder, each slice upserted into Milvus (stale
chunks deleted after the new ones are in) and merged into the graph while the embedder works
on the next slices."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

from batch_ingest.documents import SourceDocument
from batch_ingest.ingest_report import DocResult, IngestReport
from batch_ingest.passage_vectors import (
    CALL_MAX_CHUNKS,
    Embedding,
    PassageVectors,
    Planned,
    Slice,
)
from batch_ingest.source_store import Key
from batch_ingest.wikilinks import extract_links, wiki_key
from deployments.errors import BackendUnavailable, GatewayError
from deployments.protocols import ChunkRecord, GraphDocument, GraphStore, VectorStore

logger = logging.getLogger("batch_ingest.pipeline")


@dataclass
class Writes:
    """What one ingestion has written so far, into its ``report``."""

    report: IngestReport
    # Documents stored unchanged (merged into the graph all the same).
    unchanged: list[SourceDocument]
    # The first document to write: its failure, with nothing written, fails the whole call.
    first: SourceDocument | None
    written: list[SourceDocument] = field(default_factory=list)
    graph_failed: set[Key] = field(default_factory=set)

    def is_first(self, doc: SourceDocument) -> bool:
        return doc is self.first

    def fail(self, docs: Planned, exc: GatewayError) -> None:
        """``docs`` failed before writing (their embedding did)."""
        logger.warning("embedding of %d documents failed: %s", len(docs), exc)
        for doc, chunks in docs:
            self.report.results.append(
                DocResult(
                    doc.doc_id,
                    doc.team_id,
                    "failed",
                    chunks=len(chunks),
                    doc_type=doc.doc_type,
                    error=exc.message,
                    retryable=isinstance(exc, BackendUnavailable),
                )
            )


class SliceWriter:
    """Writes the slices of one ingestion.

    Args:
        store: the chunk collection; ``graph``: the knowledge graph (``None``: no graph).
        vectors: makes the slices' vectors.
        meter: counts what was embedded (called once, whatever happens).
    """

    def __init__(
        self,
        store: VectorStore,
        graph: GraphStore | None,
        vectors: PassageVectors,
        meter: Callable[[Planned], Awaitable[None]],
    ) -> None:
        self.store = store
        self.graph = graph
        self.vectors = vectors
        self.meter = meter

    async def write(
        self,
        parts: list[Slice],
        kept: dict[str, Embedding],
        stored: Mapping[Key, list[tuple[str, str, str]]],
        writes: Writes,
    ) -> None:
        """Every slice's chunks sent to the embedder at once (it batches them all); each
        slice written, and merged into the graph, as soon as its vectors are back, while the
        embedder works on the next ones. An embedding that fails before anything is written
        raises (nothing is written); after that, it fails its slice's documents only."""
        tasks = [asyncio.create_task(self.vectors.embed(part.to_embed)) for part in parts]
        embedded: Planned = []
        try:
            for part, task in zip(parts, tasks, strict=True):
                try:
                    fresh = await task
                except GatewayError as exc:
                    if not writes.written:
                        raise
                    writes.fail(part.docs, exc)
                    continue
                embedded.extend(
                    (doc, [c for c in chunks if c.chunk_id not in kept])
                    for doc, chunks in part.docs
                )
                done = [
                    doc
                    for doc, chunks in part.docs
                    if await self._write_doc(doc, chunks, kept, fresh, stored, writes)
                ]
                # Unchanged documents are merged too (MERGE is idempotent), with the first
                # slice: a re-send repairs a graph that missed them during an outage.
                first = part is parts[0]
                await self.merge_graph(done + (writes.unchanged if first else []), writes)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.meter(embedded)

    async def _write_doc(
        self,
        doc: SourceDocument,
        chunks: list[ChunkRecord],
        kept: Mapping[str, Embedding],
        fresh: Mapping[str, Embedding],
        stored: Mapping[Key, list[tuple[str, str, str]]],
        writes: Writes,
    ) -> bool:
        """Upsert ``doc``'s chunks, then delete its stale ones; whether it was written."""
        result = DocResult(
            doc.doc_id,
            doc.team_id,
            "indexed",
            chunks=len(chunks),
            doc_type=doc.doc_type,
            embedded_chunks=sum(1 for c in chunks if c.chunk_id not in kept),
        )
        try:
            with_vectors = [
                _with_vector(c, kept.get(c.chunk_id) or fresh[c.chunk_id]) for c in chunks
            ]
            for i in range(0, len(with_vectors), CALL_MAX_CHUNKS):
                await self.store.upsert(with_vectors[i : i + CALL_MAX_CHUNKS])
            # Stale = stored before and no longer produced; deleted by primary key, and
            # only when there are any (a new document costs no delete at all).
            ids = {c.chunk_id for c in chunks}
            key = (doc.team_id, doc.doc_type, doc.doc_id)
            stale = [cid for cid, _, _ in stored.get(key, []) if cid not in ids]
            result.removed_chunks = (
                await self.store.delete_chunks(doc.team_id, stale) if stale else 0
            )
        except GatewayError as exc:
            if not writes.written and isinstance(exc, BackendUnavailable) and writes.is_first(doc):
                raise
            result.status, result.error = "failed", exc.message
            result.retryable = isinstance(exc, BackendUnavailable)
            logger.warning("ingest of %s/%s failed: %s", doc.team_id, doc.doc_id, exc)
        else:
            result.written = True
            writes.written.append(doc)
        writes.report.results.append(result)
        return result.written

    async def merge_graph(self, docs: list[SourceDocument], writes: Writes) -> None:
        """MERGE ``docs`` into the graph; a failure leaves them searchable and says the
        graph lags (their registry version stays behind, so a redelivery retries it)."""
        if not docs or self.graph is None:
            return
        keys = {(d.team_id, d.doc_type, d.doc_id) for d in docs}
        try:
            await self.graph.merge_documents([_graph_doc(d) for d in docs])
        except Exception as exc:
            logger.warning("graph merge failed: %s", exc)
            writes.report.degraded.append(f"graph not updated: {exc}")
            writes.graph_failed |= keys
            return
        for result in writes.report.results:
            if (
                result.status != "failed"
                and (result.team_id, result.doc_type, result.doc_id) in keys
            ):
                result.graph = True


def _with_vector(chunk: ChunkRecord, embedding: Embedding) -> ChunkRecord:
    vector, lexical = embedding
    return replace(chunk, vector=[float(x) for x in vector], lexical=lexical)


def _graph_doc(doc: SourceDocument) -> GraphDocument:
    return GraphDocument(
        team_id=doc.team_id,
        doc_id=doc.doc_id,
        title=doc.title,
        visibility=doc.visibility,
        doc_type=doc.doc_type,
        url=doc.url,
        project_id=doc.project_id,
        channel_id=doc.channel_id,
        agent_id=doc.agent_id,
        tags=tuple(doc.tags),
        created_at=doc.created_at,
        author_id=doc.author_id,
        links=extract_links(doc.text),
        wiki_id=wiki_key(doc.doc_id),
        wiki_title=wiki_key(doc.title),
        acl_allow=doc.acl_allow,
        acl_deny=doc.acl_deny,
    )
