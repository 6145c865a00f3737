"""Chunk rows of the Milvus collections: the fields a search returns, ``ChunkRecord`` ↔ row,
and the names of a team's collections."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from deployments.acl import ACL_FIELDS, OPEN_ALLOW, is_open, tokens_key
from deployments.config import MilvusSettings
from deployments.errors import Conflict
from deployments.protocols import (
    ChunkRecord,
)
from deployments.vector_store.filter import (
    milvus_literal,
)

# Milvus refuses an empty sparse vector: a chunk without learned weights (or whose text had
# none) stores this one entry, on a token id beyond any vocabulary, that no query matches.
NO_LEXICAL = {4_294_967_294: 1e-9}

# The single-method searches of the store (the gateway fuses their lists itself): ``lexical``
# is the learned sparse field of a BGE-M3 collection.
SEARCH_METHODS = ("dense", "bm25", "lexical")

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


def output_fields(*, acl: bool, dense: bool = False, lexical: bool = False) -> list[str]:
    """The fields a read asks for: the ACL ones only of a collection that has them; with
    ``dense`` the vector, and the learned sparse weights too where the collection has them."""
    vectors = ("dense", *(("lexical",) if lexical else ())) if dense else ()
    return [*OUTPUT_FIELDS, *(ACL_FIELDS if acl else ()), *vectors]


def doc_expr(team_id: str, doc_type: str, doc_id: str) -> str:
    return (
        f"team_id == {milvus_literal(team_id)} and doc_type == {milvus_literal(doc_type)} "
        f"and doc_id == {milvus_literal(doc_id)}"
    )


def chunk_to_row(chunk: ChunkRecord, *, acl: bool = True, lexical: bool = False) -> dict[str, Any]:
    """The row of ``chunk``; ``acl``: the collection has the ACL fields; ``lexical``: it has
    the learned sparse field (a chunk without weights stores ``NO_LEXICAL`` there; a
    collection without the field keeps only the dense vector).

    Raises:
        Conflict: a chunk with an access list for a collection built before ACLs (it could
            not be filtered there; a reindex builds the team's collection anew).
    """
    row = _row(chunk)
    if lexical:
        weights = {int(t): float(w) for t, w in (chunk.lexical or {}).items() if w > 0}
        row["lexical"] = weights or NO_LEXICAL
    if acl:
        allow = tuple(chunk.acl_allow or OPEN_ALLOW)
        row["acl_allow"] = list(allow)
        row["acl_deny"] = list(chunk.acl_deny)
        row["acl_allow_key"] = tokens_key(allow, empty="*")
        row["acl_deny_key"] = tokens_key(chunk.acl_deny, empty="")
    elif not is_open(chunk.acl_allow, chunk.acl_deny):
        raise Conflict(
            f"document {chunk.doc_id!r} has an access list but team {chunk.team_id!r}'s "
            "collection was built before document ACLs; rebuild it (python -m "
            f"batch_ingest.reindex --team {chunk.team_id}) and send the document again",
            reason="collection_without_acl",
            hint="rebuild the team's index (python -m batch_ingest.reindex --team "
            f"{chunk.team_id}), then send the document again",
        )
    return row


def _row(chunk: ChunkRecord) -> dict[str, Any]:
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
        acl_allow=tuple(row.get("acl_allow") or OPEN_ALLOW),
        acl_deny=tuple(row.get("acl_deny") or ()),
    )


def chunk_with_vector(row: dict[str, Any]) -> ChunkRecord:
    lexical = row.get("lexical")
    return replace(
        row_to_chunk(row),
        vector=[float(x) for x in row["dense"]],
        lexical=None if lexical is None else sparse_map(lexical),
    )


def sparse_map(value: Any) -> dict[int, float]:
    """A sparse vector as Milvus returns it (a ``{index: value}`` map, or a scipy row) as
    ``{token id: weight}``."""
    pairs: Iterable[tuple[Any, Any]]
    if hasattr(value, "tocoo"):
        coo = value.tocoo()
        pairs = zip(coo.col, coo.data, strict=True)
    else:
        pairs = dict(value).items()
    return {int(i): float(v) for i, v in pairs if int(i) not in NO_LEXICAL}


def team_slug(team_id: str) -> str:
    """A collection-name-safe, collision-free token for ``team_id``: readable prefix + hash."""
    readable = re.sub(r"[^a-z0-9]+", "_", team_id.lower()).strip("_")[:32]
    digest = hashlib.sha256(team_id.encode("utf-8")).hexdigest()[:12]
    return f"{readable}_{digest}" if readable else f"t_{digest}"


def collection_for(settings: MilvusSettings, team_id: str) -> str:
    """The logical collection (an alias) that holds ``team_id``'s chunks."""
    if settings.layout == "shared":
        return settings.collection
    return f"{settings.collection}__{team_slug(team_id)}"
