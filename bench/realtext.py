"""Real-text chunks with real embeddings for the search benchmarks, cached on disk.

* AppStream: the 2,126 English software descriptions of Debian's DEP-11 catalogue
  (``bench.quality.appstream_set``), queried by their one-line summaries (natural-language
  queries of 2–12 words, "SMS/MMS messaging client").
* KJV: the 31,102 King James verses (Debian ``sword-text-kjv``), used to grow a tenant with
  more real text (``kjv_documents``).

Chunks are built with the gateway's own chunker and ids (``batch_ingest.chunks.chunk_builder``) and
embedded in this process with ``EmbedderCore`` (the deployment's class, the default model).
Vectors are cached by the SHA-256 of model tag + chunk text in ``bench/results/cache/``
(git-ignored), so the second run of a benchmark embeds nothing.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from batch_ingest.chunks import chunk_builder as chunks_of
from batch_ingest.documents import SourceDocument
from bench.common import Progress
from bench.quality.bible_set import LabeledSet
from deployments.protocols import ChunkRecord
from serve_app.settings import GatewaySettings

logger = logging.getLogger("bench.realtext")

CACHE_DIR = Path(__file__).resolve().parent / "results" / "cache"


def appstream(team_id: str) -> LabeledSet:
    """Every AppStream description of the catalogue as a document, every component summary
    as a query (ids ``q0000``…, in the labeled set's fixed order) with its relevant ids."""
    from bench.quality import appstream_set

    return appstream_set.build(team_id=team_id, extra_test=True)


def kjv_documents(team_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    """KJV verses as documents (one chunk each), in canonical order, at most ``limit``."""
    from bench.quality.bible_set import KJV_MODULE, doc_id, export_module

    verses = export_module(KJV_MODULE)
    out = []
    for ref, text in verses.items():
        out.append(
            {
                "team_id": team_id,
                "doc_id": f"kjv-{doc_id(ref)}",
                "doc_type": "doc",
                "title": f"{ref[0].replace('_', ' ')} {ref[1]}:{ref[2]}",
                "text": text,
                "tags": ["kjv", ref[0].lower()],
            }
        )
        if limit is not None and len(out) >= limit:
            break
    return out


def kjv_chapters(team_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    """KJV chapters as documents (1,189 of them, 300–2,500 words: several 200-token chunks
    each), in canonical order, at most ``limit``."""
    from bench.quality.bible_set import KJV_MODULE, export_module

    chapters: dict[tuple[str, int], list[str]] = {}
    for (book, chapter, _), text in export_module(KJV_MODULE).items():
        chapters.setdefault((book, chapter), []).append(text)
    out = []
    for (book, chapter), verses in list(chapters.items())[:limit]:
        out.append(
            {
                "team_id": team_id,
                "doc_id": f"kjv-{book}.{chapter}",
                "doc_type": "doc",
                "title": f"{book.replace('_', ' ')} {chapter}",
                "text": " ".join(verses),
                "tags": ["kjv", book.lower()],
            }
        )
    return out


def build_chunks(docs: list[dict[str, Any]], settings: GatewaySettings) -> list[ChunkRecord]:
    """The gateway's chunks of ``docs`` (no vectors), tagged with the embedder's model."""
    builder = chunks_of(settings.chunking, settings.embedder)
    chunks: list[ChunkRecord] = []
    for raw in docs:
        chunks += builder.build_chunks(SourceDocument.model_validate(raw))
    return chunks


def _key(tag: str, kind: str, text: str) -> str:
    return hashlib.sha256(f"{tag}\n{kind}\n{text}".encode()).hexdigest()[:32]


def embed_texts(
    texts: list[str],
    settings: GatewaySettings,
    *,
    kind: str = "passage",
    name: str = "texts",
    threads: int = 2,
) -> np.ndarray:
    """``(len(texts), dim)`` float32 embeddings, from the cache where it has them."""
    tag = settings.embedder.embed_model_tag
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = CACHE_DIR / f"{name}-{kind}-{hashlib.sha256(tag.encode()).hexdigest()[:8]}.npz"
    cached: dict[str, np.ndarray] = {}
    if path.exists():
        with np.load(path) as data:
            cached = dict(zip(data["keys"].tolist(), data["vectors"], strict=True))
    keys = [_key(tag, kind, t) for t in texts]
    missing = sorted({k: i for i, k in enumerate(keys) if k not in cached}.values())
    if missing:
        from deployments.models.embedding import EmbedderCore

        core = EmbedderCore(settings.embedder.model_copy(update={"torch_threads": threads}))
        logger.info("embedding %d of %d %s (cache %s)", len(missing), len(texts), name, path)
        progress = Progress(f"embed {name}", len(missing), "texts", every_s=15.0)
        for start in range(0, len(missing), 256):
            part = missing[start : start + 256]
            vectors = core.embed([texts[i] for i in part], kind)
            for i, vec in zip(part, vectors, strict=True):
                cached[keys[i]] = vec
            progress.add(len(part))
        np.savez(path, keys=np.array(list(cached)), vectors=np.stack(list(cached.values())))
    return np.stack([cached[k] for k in keys]).astype(np.float32)


def embed_chunks(
    chunks: list[ChunkRecord], settings: GatewaySettings, *, name: str = "chunks"
) -> list[ChunkRecord]:
    """``chunks`` with their passage vectors."""
    vectors = embed_texts([c.text for c in chunks], settings, name=name)
    return [replace(c, vector=v.tolist()) for c, v in zip(chunks, vectors, strict=True)]


def with_acls(chunks: list[Any], share: float) -> list[Any]:
    """``share`` of the documents (by a hash of the doc id, stable across runs) get an ACL
    that a reader holding ``bench_readers`` passes: allowed group ``bench_readers``, denied group
    ``bench_contractors``."""
    if share <= 0:
        return chunks

    def restricted(doc_id: str) -> bool:
        digest = hashlib.sha256(doc_id.encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32 < share

    return [
        replace(c, acl_allow=("group:bench_readers",), acl_deny=("group:bench_contractors",))
        if restricted(c.doc_id)
        else c
        for c in chunks
    ]
