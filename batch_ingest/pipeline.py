"""The idempotent ingestion pipeline: chunk → embed → upsert Milvus → drop stale → MERGE graph.

Order matters for "nothing accepted is lost": new chunks are upserted before the stale ones
of the same document are deleted, so a document is never absent from search, and a failure
on one document leaves every document before it fully indexed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from batch_ingest.chunking import Chunker, TokenCounter, embedder_token_counter
from batch_ingest.chunks import ChunkBuilder
from batch_ingest.documents import SourceDocument
from batch_ingest.generations import IndexGenerations
from batch_ingest.ingest_report import DocResult, IngestReport, unrecorded
from batch_ingest.passage_vectors import PassageVectors, Planned, slices
from batch_ingest.settings import BatchSettings
from batch_ingest.slice_writer import SliceWriter, Writes
from batch_ingest.source_store import Key, SourceStore
from batch_ingest.usage import EmbeddingUsage
from batch_ingest.write_barrier import write_barrier
from deployments.errors import BackendUnavailable, GatewayError
from deployments.metrics import EMBEDDED_TOKENS
from deployments.protocols import (
    Backends,
    ChunkRecord,
    Embedder,
    GraphStore,
    VectorStore,
)

logger = logging.getLogger(__name__)

# Chunks of one slice of a request: its documents are written (and merged into the graph)
# while the embedder works on the next slices' chunks. Every slice is sent to the embedder at
# once, so this sets how early writing starts, not how the embedder batches.
WRITE_SLICE_CHUNKS = 64


def build_pipeline(
    settings: BatchSettings,
    backends: Backends,
    *,
    count_tokens: TokenCounter | None = None,
    sources: SourceStore | None = None,
    usage_source: str = "api",
) -> IngestPipeline:
    """The ingestion pipeline ``settings`` describe over ``backends``: chunking settings,
    the embedder's tokenizer (``count_tokens`` replaces it) and model tag; ``sources`` is
    the source-document registry (``None`` keeps none)."""
    count = count_tokens or embedder_token_counter(settings.embedder)
    return IngestPipeline(
        embedder=backends.embedder,
        store=backends.store,
        graph=backends.graph,
        chunker=Chunker(count, settings.chunking.max_tokens, settings.chunking.overlap_tokens),
        embed_model=settings.embedder.embed_model_tag,
        sources=sources,
        usage_source=usage_source,
        lexical=settings.embedder.lexical,
        other_models=[e.embed_model_tag for e in settings.embedders[1:]],
    )


class IngestPipeline:
    """Indexes source documents idempotently.

    Args:
        embedder: makes passage vectors.
        store: the chunk collection.
        graph: the knowledge graph; ``None`` skips graph writes.
        chunker: cuts documents into chunks.
        embed_model: tag stored in every chunk (``name@version``).
        lexical: the embedder makes learned sparse weights too (BGE-M3): passages are
            ``encode``d and the weights stored beside the vectors.
        other_models: tags of the other models the embedder serves (the next one during a
            change of model): a team whose live version holds one of them
            (``store.embed_model``) has its chunks embedded with that model (``model=``), so
            what is written after a reindex switched the team matches its new version.
    """

    def __init__(
        self,
        *,
        embedder: Embedder,
        store: VectorStore,
        graph: GraphStore | None,
        chunker: Chunker,
        embed_model: str,
        sources: SourceStore | None = None,
        usage_source: str = "api",
        lexical: bool = False,
        other_models: Sequence[str] = (),
    ) -> None:
        self.lexical = lexical
        self.embed_model = embed_model
        self.other_models = tuple(m for m in other_models if m != embed_model)
        self.chunks = ChunkBuilder(chunker, embed_model)
        self.vectors = PassageVectors(embedder, store, embed_model, lexical)
        self.writer = SliceWriter(store, graph, self.vectors, self._meter)
        self.embedder, self.store, self.graph = embedder, store, graph
        # The source-document registry (reindex reads it); None keeps no registry.
        self.sources = sources
        # Raised after every change a search can see (the semantic cache keys by it).
        self.generations = IndexGenerations(sources.engine) if sources is not None else None
        # The embedding ledger (batch_ingest/usage.py), as ``usage_source`` (api, bus).
        self.usage = EmbeddingUsage(sources.engine) if sources is not None else None
        self.usage_source = usage_source
        # Paused by a reindex switching a team's alias (None without a registry).
        self.barrier = write_barrier(sources)

    # The backends live in the parts that use them; replacing one here (a test's failing
    # store, a graph that came back) replaces it everywhere.
    @property
    def embedder(self) -> Embedder:
        return self.vectors.embedder

    @embedder.setter
    def embedder(self, embedder: Embedder) -> None:
        self.vectors.embedder = embedder

    @property
    def store(self) -> VectorStore:
        return self.writer.store

    @store.setter
    def store(self, store: VectorStore) -> None:
        self.vectors.store = self.writer.store = store

    @property
    def graph(self) -> GraphStore | None:
        return self.writer.graph

    @graph.setter
    def graph(self, graph: GraphStore | None) -> None:
        self.writer.graph = graph

    def build_chunks(self, doc: SourceDocument) -> list[ChunkRecord]:
        """Chunk records without vectors; ids and hashes are deterministic."""
        return self.chunks.build_chunks(doc)

    async def ingest(
        self, docs: list[SourceDocument], versions: dict[Key, int] | None = None
    ) -> IngestReport:
        """Index ``docs`` in order; report per document. ``versions`` (event versions by
        ``(team_id, doc_type, doc_id)``) go to the source registry with them. Runs holding
        the teams' write barrier (``batch_ingest.write_barrier``): a reindex never switches
        a team's alias between this call's first read and its registry record.

        Raises:
            BackendUnavailable: if the embedder or Milvus fails before any document is
                written, or a reindex switch kept the team's writes paused too long.
        """
        if self.barrier is None or not docs:
            return await self._ingest(docs, versions)
        async with self.barrier.writing(d.team_id for d in docs):
            return await self._ingest(docs, versions)

    async def _ingest(
        self, docs: list[SourceDocument], versions: dict[Key, int] | None
    ) -> IngestReport:
        started = time.perf_counter()
        report = IngestReport()
        planned, unchanged, found = await self._plan(docs, report)
        # Only a changed document that existed before can leave stale chunks behind.
        existing = [(d.team_id, d.doc_type, d.doc_id) for d, c in planned if c[0].chunk_id in found]
        stored = await self.store.fingerprints(existing) if existing else {}
        # A chunk whose text and model are stored already keeps its vector: a change of
        # metadata only (access list, tags, visibility) re-permissions without embedding.
        kept = await self.vectors.stored(planned, found)
        writes = Writes(report, unchanged, planned[0][0] if planned else None)
        await self.writer.write(slices(planned, kept, WRITE_SLICE_CHUNKS), kept, stored, writes)
        if not planned:
            await self.writer.merge_graph(unchanged, writes)
        # The registry is written last: an event whose graph write failed keeps the version
        # recorded before it, so its redelivery is applied again (and retries the graph).
        to_graph = writes.written + unchanged
        if to_graph and self.sources is not None:
            try:
                await asyncio.to_thread(self.sources.put, to_graph, versions, writes.graph_failed)
            except Exception as exc:
                logger.warning("source registry not updated: %s", exc)
                report.degraded.append(f"source registry not updated: {exc}")
                unrecorded(report, {(d.team_id, d.doc_type, d.doc_id) for d in to_graph}, exc)
        # Failed writes too: a document may be half written.
        await self._bump({r.team_id for r in report.results if r.status != "unchanged"}, report)
        report.took_ms = round((time.perf_counter() - started) * 1000, 1)
        return report

    async def _plan(
        self, docs: list[SourceDocument], report: IngestReport
    ) -> tuple[Planned, list[SourceDocument], dict[str, tuple[str, str]]]:
        """The documents to write with their chunks, those stored unchanged (reported as
        such), and ``chunk_id → (content_hash, embed_model)`` of the chunks already stored."""
        # Off the event loop: a long document takes seconds to tokenize.
        built = await asyncio.to_thread(lambda: [(d, self.build_chunks(d)) for d in docs])
        built = await self._for_live_models(built)
        # Primary-key lookups only (filtered scans are slow in Milvus Lite): chunk ids are
        # deterministic, so the new ids find whatever of the document is already stored.
        by_team: dict[str, list[str]] = {}
        for _, chunks in built:
            for c in chunks:
                by_team.setdefault(c.team_id, []).append(c.chunk_id)
        found: dict[str, tuple[str, str]] = {}
        for team_id, chunk_ids in by_team.items():
            found.update(await self.store.lookup(team_id, chunk_ids))
        planned: Planned = []
        unchanged: list[SourceDocument] = []
        for doc, chunks in built:
            if all(found.get(c.chunk_id) == (c.content_hash, c.embed_model) for c in chunks):
                unchanged.append(doc)
                report.results.append(
                    DocResult(
                        doc.doc_id,
                        doc.team_id,
                        "unchanged",
                        chunks=len(chunks),
                        doc_type=doc.doc_type,
                    )
                )
            else:
                planned.append((doc, chunks))
        return planned, unchanged, found

    async def _for_live_models(
        self, built: list[tuple[SourceDocument, list[ChunkRecord]]]
    ) -> list[tuple[SourceDocument, list[ChunkRecord]]]:
        """During a change of model: the chunks of a team whose live version holds another
        served model's vectors, tagged with that model (read under the write barrier, so a
        reindex cannot switch the team before this call is recorded)."""
        # A store that cannot say (a test double) holds the primary model's vectors.
        model_of = getattr(self.store, "embed_model", None)
        if not self.other_models or model_of is None:
            return built
        live: dict[str, str | None] = {}
        for team_id in dict.fromkeys(d.team_id for d, _ in built):
            live[team_id] = await model_of(team_id)
        out = []
        for doc, chunks in built:
            tag = live.get(doc.team_id)
            if tag in self.other_models:
                chunks = [replace(c, embed_model=tag) for c in chunks]
            out.append((doc, chunks))
        return out

    async def _meter(self, embedded: list[tuple[SourceDocument, list[ChunkRecord]]]) -> None:
        """Count the tokens just embedded per team, with the chunker's own counter: into the
        embedding ledger of the state database (every process) and ``EMBEDDED_TOKENS``
        (where it is exported: a Serve replica). A ledger that cannot be written is logged;
        the documents are indexed all the same."""
        live = EMBEDDED_TOKENS.live
        if not embedded or (self.usage is None and not live):
            return
        count = self.chunks.chunker.count
        by_team: dict[str, tuple[int, int]] = {}
        for _, chunks in embedded:
            for c in chunks:
                tokens, n = by_team.get(c.team_id, (0, 0))
                by_team[c.team_id] = (tokens + count(c.text), n + 1)
        if live:
            for team_id, (tokens, _) in by_team.items():
                EMBEDDED_TOKENS.inc(tokens, team_id=team_id)
        if self.usage is not None:
            try:
                await asyncio.to_thread(self.usage.add, self.usage_source, by_team)
            except Exception as exc:
                logger.warning("embedding ledger not updated: %s", exc)

    async def _bump(self, teams: set[str], report: IngestReport) -> None:
        problem = await self.bump_generations(teams)
        if problem:
            report.degraded.append(
                "index generation not raised (cached answers may lag; in-memory indexes "
                f"notice the write within milvus.memory_index.generation_trust_s): {problem}"
            )

    async def bump_generations(self, teams: set[str]) -> str | None:
        """A new generation for ``teams`` (after their writes, so a cache keyed by the old
        one can no longer answer); what went wrong, if it could not be raised."""
        if not teams or self.generations is None:
            return None
        for attempt in (1, 2):  # once more: searches trust an unchanged generation
            try:
                await asyncio.to_thread(self.generations.bump, teams)
                return None
            except Exception as exc:
                logger.warning(
                    "index generation not raised for %s (try %d): %s", sorted(teams), attempt, exc
                )
                problem = str(exc)
                await asyncio.sleep(0.1)
        return problem

    async def delete(self, keys: list[Key], versions: dict[Key, int] | None = None) -> IngestReport:
        """Delete documents by ``(team_id, doc_type, doc_id)``: their chunks from Milvus (by
        primary key), their ``Doc`` node from the graph (shared entity nodes stay), then a
        tombstone with the event version in the source registry. A key that was never stored
        is still tombstoned (a late older upsert must not create it). A document whose chunks
        or graph node could not be removed is ``failed`` and not tombstoned, so a redelivery
        retries it; deleting twice is harmless.

        Runs holding the teams' write barrier, like ``ingest``.

        Raises:
            BackendUnavailable: if Milvus fails before any chunk was removed.
        """
        if self.barrier is None or not keys:
            return await self._delete(keys, versions)
        async with self.barrier.writing(k[0] for k in keys):
            return await self._delete(keys, versions)

    async def _delete(self, keys: list[Key], versions: dict[Key, int] | None) -> IngestReport:
        started = time.perf_counter()
        report = IngestReport()
        keys = list(dict.fromkeys(keys))
        stored = await self.store.fingerprints(keys) if keys else {}
        removed: list[DocResult] = []
        for team_id, doc_type, doc_id in keys:
            ids = [cid for cid, _, _ in stored.get((team_id, doc_type, doc_id), [])]
            result = DocResult(doc_id, team_id, "deleted", doc_type=doc_type)
            try:
                result.removed_chunks = await self.store.delete_chunks(team_id, ids) if ids else 0
                removed.append(result)
            except GatewayError as exc:
                if not removed and isinstance(exc, BackendUnavailable):
                    raise
                result.status, result.error = "failed", exc.message
                result.retryable = isinstance(exc, BackendUnavailable)
                logger.warning("delete of %s/%s failed: %s", team_id, doc_id, exc)
            report.results.append(result)
        if self.graph is not None and removed:
            by_team: dict[str, list[DocResult]] = {}
            for r in removed:
                by_team.setdefault(r.team_id, []).append(r)
            for team_id, rows in by_team.items():
                try:
                    await self.graph.delete_documents(team_id, [r.doc_id for r in rows])
                    for r in rows:
                        r.graph = True
                except Exception as exc:  # chunks are gone; retry the graph on redelivery
                    logger.warning("graph delete failed: %s", exc)
                    report.degraded.append(f"graph not updated: {exc}")
                    for r in rows:
                        r.status, r.error = "failed", f"graph delete failed: {exc}"
                        r.retryable = True
        if self.sources is not None:
            for r in report.results:
                if r.status != "deleted":
                    continue
                key = (r.team_id, r.doc_type, r.doc_id)
                try:
                    await asyncio.to_thread(self.sources.tombstone, key, (versions or {}).get(key))
                except Exception as exc:
                    logger.warning("source registry not updated: %s", exc)
                    report.degraded.append(f"source registry not updated: {exc}")
                    unrecorded(report, {key}, exc)
        await self._bump({r.team_id for r in report.results}, report)
        report.took_ms = round((time.perf_counter() - started) * 1000, 1)
        return report
