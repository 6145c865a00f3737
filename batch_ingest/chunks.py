"""Chunk records of a source document: the chunker's pieces with their context header
(title › heading), deterministic ids and content hashes, and the model tag — no vectors.
Pure: ingestion, reindex, benchmarks and the ingress (``strip_header``) share it."""

from __future__ import annotations

from batch_ingest.chunking import Chunker, embedder_token_counter
from batch_ingest.documents import SourceDocument, content_hash, make_chunk_id
from batch_ingest.settings import ChunkingSettings
from deployments.config import EmbedderSettings
from deployments.protocols import ChunkRecord


def context_header(title: str, heading: str) -> str:
    """The first line of every stored chunk text: title and heading path, so both are
    matched by BM25 and seen by the embedder."""
    return " › ".join(part for part in (title, heading) if part)


def compose_text(title: str, heading: str, body: str) -> str:
    header = context_header(title, heading)
    return f"{header}\n\n{body}" if header else body


def strip_header(chunk: ChunkRecord) -> str:
    """The chunk body without the context header added by ``compose_text``."""
    header = context_header(chunk.title, chunk.heading)
    if header and chunk.text.startswith(header + "\n\n"):
        return chunk.text[len(header) + 2 :]
    return chunk.text


class ChunkBuilder:
    """Cuts documents into chunk records tagged ``embed_model`` (``name@version``)."""

    def __init__(self, chunker: Chunker, embed_model: str) -> None:
        self.chunker = chunker
        self.embed_model = embed_model

    def build_chunks(self, doc: SourceDocument) -> list[ChunkRecord]:
        """Chunk records without vectors; ids and hashes are deterministic."""
        meta = doc.metadata_fingerprint()
        pieces = self.chunker.split(doc.text)
        records = []
        for piece in pieces:
            text = compose_text(doc.title, piece.heading, piece.text)
            records.append(
                ChunkRecord(
                    chunk_id=make_chunk_id(doc.team_id, doc.doc_type, doc.doc_id, piece.index),
                    doc_id=doc.doc_id,
                    team_id=doc.team_id,
                    chunk_index=piece.index,
                    text=text,
                    title=doc.title,
                    heading=piece.heading,
                    # The chunk count is hashed too: equal hashes for ids 0..n-1 then mean the
                    # stored document has no chunks beyond n-1.
                    content_hash=content_hash(text, meta, f"{piece.index}/{len(pieces)}"),
                    embed_model=self.embed_model,
                    visibility=doc.visibility,
                    doc_type=doc.doc_type,
                    project_id=doc.project_id,
                    channel_id=doc.channel_id,
                    agent_id=doc.agent_id,
                    url=doc.url,
                    tags=tuple(doc.tags),
                    created_at=doc.created_at,
                    acl_allow=doc.acl_allow,
                    acl_deny=doc.acl_deny,
                )
            )
        return records


def chunk_builder(
    chunking: ChunkingSettings, embedder: EmbedderSettings, embed_model: str | None = None
) -> ChunkBuilder:
    """The builder the settings describe: the embedder's tokenizer counts the tokens;
    ``embed_model`` defaults to the embedder's tag."""
    chunker = Chunker(
        embedder_token_counter(embedder), chunking.max_tokens, chunking.overlap_tokens
    )
    return ChunkBuilder(chunker, embed_model or embedder.embed_model_tag)
