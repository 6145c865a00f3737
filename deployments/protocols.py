"""Interfaces of the backends and the records that cross them.

The ingress, the ingestion pipeline and the tests depend on these protocols only; the Serve
deployments, their core classes and the unit-test fakes all implement them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from deployments.acl import OPEN_ALLOW

Visibility = Literal["public", "confidential"]
VISIBILITIES: tuple[str, ...] = ("public", "confidential")
DOC_TYPES: tuple[str, ...] = ("message", "doc", "file", "wiki", "rwa", "transaction")
TextKind = Literal["query", "passage"]


# Field sizes of a chunk row (the Milvus schema is built from them; ingestion validates
# documents against the same numbers).
MAX_ID = 256
MAX_TITLE = 1024
MAX_URL = 2048
MAX_TEXT = 16384
MAX_TAGS = 64
MAX_TAG = 128


@dataclass(frozen=True)
class ChunkRecord:
    """One row of the Milvus chunk collection (see docs/data_contracts.md)."""

    chunk_id: str
    doc_id: str
    team_id: str
    chunk_index: int
    text: str
    title: str
    content_hash: str
    embed_model: str
    visibility: str = "public"
    doc_type: str = "doc"
    project_id: str = ""
    channel_id: str = ""
    agent_id: str = ""
    url: str = ""
    tags: tuple[str, ...] = ()
    created_at: int = 0  # seconds since the epoch, UTC
    heading: str = ""
    # Document ACL tokens (deployments/acl.py): who may read it beyond team and visibility.
    acl_allow: tuple[str, ...] = OPEN_ALLOW
    acl_deny: tuple[str, ...] = ()
    vector: Sequence[float] = field(default=(), repr=False)
    # Learned sparse weights ``token id → weight`` (BGE-M3's lexical head), when the
    # embedder makes them; ``None``: it does not (the collection's ``lexical`` field).
    lexical: Mapping[int, float] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Encoded:
    """What an embedder makes of some texts: one dense vector each and, when its model has a
    learned sparse head (BGE-M3), one ``token id → weight`` map each (else ``None``)."""

    dense: np.ndarray
    lexical: list[dict[int, float]] | None = None

    def part(self, start: int, end: int) -> Encoded:
        """Texts ``start:end`` (one request's share of a batch)."""
        lexical = None if self.lexical is None else self.lexical[start:end]
        return Encoded(self.dense[start:end], lexical)

    @staticmethod
    def join(parts: Sequence[Encoded]) -> Encoded:
        """The parts' texts in order, as one."""
        if len(parts) == 1:
            return parts[0]
        lexical = None if parts[0].lexical is None else [w for p in parts for w in p.lexical or ()]
        return Encoded(np.concatenate([p.dense for p in parts]), lexical)

    def rows(self) -> list[tuple[np.ndarray, dict[int, float] | None]]:
        """Per text: its vector and its weights (``None`` without a sparse head)."""
        lexical: Sequence[dict[int, float] | None] = self.lexical or [None] * len(self.dense)
        return list(zip(self.dense, lexical, strict=True))


@dataclass(frozen=True)
class SearchFilter:
    """Everything that narrows a search. Built only from an AccessContext and validated
    request filters; the vector store binds every value as a parameter."""

    team_id: str
    visibilities: tuple[str, ...] = ("public",)
    project_id: str | None = None
    channel_id: str | None = None
    agent_id: str | None = None
    doc_types: tuple[str, ...] = ()
    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    created_from: int | None = None
    created_to: int | None = None
    # Only these documents (graph-scoped retrieval); empty = no restriction.
    doc_ids: tuple[str, ...] = ()
    # The caller's ACL tokens (deployments.acl.principal_tokens); the default sees only
    # documents without an access list.
    acl_principals: tuple[str, ...] = OPEN_ALLOW


@dataclass(frozen=True)
class SearchHit:
    """A chunk returned by the vector store with its fused score and per-method scores."""

    chunk: ChunkRecord
    score: float
    scores: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, chunk: ChunkRecord, score: float, scores: dict[str, float]) -> SearchHit:
        """``SearchHit(chunk, score, scores)`` for the hot loops that make hundreds per
        search (the memory index's candidates, fusion): the frozen ``__init__`` sets each
        field through ``object.__setattr__``, 0.5 µs a hit; this fills the new instance's
        ``__dict__`` directly, 0.2 µs. The instance is as frozen as any other."""
        hit = object.__new__(cls)
        fields = hit.__dict__
        fields["chunk"], fields["score"], fields["scores"] = chunk, score, scores
        return hit


@dataclass(frozen=True)
class GraphDocument:
    """What ingestion writes to the graph for one document."""

    team_id: str
    doc_id: str
    title: str
    visibility: str
    doc_type: str
    url: str = ""
    project_id: str = ""
    channel_id: str = ""
    agent_id: str = ""
    tags: tuple[str, ...] = ()
    created_at: int = 0
    # The user who wrote it: (:User)-[:AUTHORED]->(:Doc).
    author_id: str = ""
    # Normalised [[wiki-link]] targets of the text (batch_ingest.wikilinks).
    links: tuple[str, ...] = ()
    # The keys links to this document resolve by: of its doc_id's last segment and of its
    # title (batch_ingest.wikilinks.wiki_key); "" answers to no link.
    wiki_id: str = ""
    wiki_title: str = ""
    # Document ACL tokens (deployments/acl.py), stored on the ``Doc`` node.
    acl_allow: tuple[str, ...] = OPEN_ALLOW
    acl_deny: tuple[str, ...] = ()


# Policy parameters that restrict nothing (see GraphScope.policy).
NO_POLICY: dict[str, Any] = {
    "doc_types": None,
    "projects_deny": True,
    "projects": [],
    "denied_skill_ids": [],
    "skill_tags_deny": True,
    "skill_tags": [],
}


@dataclass(frozen=True)
class GraphScope:
    """What a graph query may touch: one team and the visibilities its caller sees. Built
    only by ``serve_app.access.graph.graph_scope``; the graph store binds both as
    ``$team_id`` and ``$visibilities`` in every statement."""

    team_id: str
    visibilities: tuple[str, ...] = ("public",)
    # The caller's doc-type, project and skill policies as parameters
    # (serve_app.access.policy.Policy.graph_params); empty = nothing beyond team and visibility.
    policy: dict[str, Any] = field(default_factory=dict, compare=False)
    # The caller's ACL tokens (deployments.acl.principal_tokens), bound as
    # ``$acl_principals``; the default sees only documents without an access list.
    acl_principals: tuple[str, ...] = OPEN_ALLOW

    @property
    def params(self) -> dict[str, Any]:
        return {
            **NO_POLICY,
            **self.policy,
            "team_id": self.team_id,
            "visibilities": list(self.visibilities),
            "acl_principals": list(self.acl_principals),
        }


@runtime_checkable
class Embedder(Protocol):
    async def embed(
        self, texts: list[str], kind: TextKind = "passage"
    ) -> np.ndarray | list[list[float]]:
        """One normalised vector per text, in order (an array, or lists of floats)."""
        ...

    async def encode(self, texts: list[str], kind: TextKind = "passage") -> Encoded:
        """The dense vectors and, when the model makes them, the learned sparse weights."""
        ...

    async def status(self) -> dict[str, Any]:
        """``{"ready": bool, "model": str, "dim": int | None, ...}``."""
        ...


@runtime_checkable
class Reranker(Protocol):
    async def rerank(self, query: str, texts: list[str]) -> list[float]:
        """One relevance score per text, higher is better."""
        ...

    async def status(self) -> dict[str, Any]: ...


@runtime_checkable
class VectorStore(Protocol):
    async def upsert(self, chunks: list[ChunkRecord]) -> int: ...

    async def delete_stale_chunks(
        self, team_id: str, doc_type: str, doc_id: str, keep: list[str]
    ) -> int:
        """Remove the document's chunks whose ids are not in ``keep``; return how many."""
        ...

    async def lookup(self, team_id: str, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        """``chunk_id → (content_hash, embed_model)`` of the team's ids that are stored."""
        ...

    async def delete_chunks(self, team_id: str, chunk_ids: list[str]) -> int:
        """Remove chunks by primary key (cheap: no filter scan); return how many were asked."""
        ...

    async def stored_chunks(self, team_id: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        """The team's stored chunks among ``chunk_ids``, with their vectors (primary-key
        reads): what a metadata-only change writes back without embedding again."""
        ...

    async def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        """The stored chunks of one document (without vectors), by chunk index."""
        ...

    async def fingerprints(
        self, docs: list[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], list[tuple[str, str, str]]]:
        """For each ``(team_id, doc_type, doc_id)``: its stored chunks as
        ``(chunk_id, content_hash, embed_model)`` by chunk index, in one round trip."""
        ...

    async def candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str = "",
        query_lexical: Mapping[int, float] | None = None,
        *,
        generation: int | None = None,
    ) -> dict[str, list[SearchHit]]:
        """Top ``limit`` chunks of each single method (``dense``, ``bm25``, ``lexical``: the
        learned sparse weights, ``query_lexical``), for fusion.

        Calls with the same non-empty ``read_id`` belong to one search (BM25 while the query
        is embedded, then dense): a store that must check it is up to date may check once.
        ``generation``: the team's index generation read after the search arrived (passed
        only when known); a store may take an unchanged one as "nothing written since"."""
        ...

    async def count(self, team_id: str) -> int: ...

    async def status(self) -> dict[str, Any]: ...


@runtime_checkable
class GraphStore(Protocol):
    async def merge_documents(self, docs: list[GraphDocument]) -> int: ...

    async def delete_documents(self, team_id: str, doc_ids: list[str]) -> int:
        """DETACH DELETE the team's ``Doc`` nodes of ``doc_ids`` (shared entity nodes such as
        Project, Channel, Topic, User stay); return how many were deleted."""
        ...

    async def upsert_entities(
        self,
        team_id: str,
        nodes: list[dict[str, Any]],
        relationships: list[dict[str, Any]],
        scope: GraphScope,
    ) -> dict[str, Any]:
        """MERGE validated entities and relationships (see serve_app.graph.contracts), or
        nothing when the write would touch what the writer's ``scope`` does not hold:
        ``{"nodes", "relationships", "refused", "changes", "derived_ends"}``."""
        ...

    async def run_intent(
        self, name: str, args: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        """``{"columns": [...], "rows": [...]}`` of a catalogue intent; values serialised
        (nodes, relationships and paths as dicts with ``_type``)."""
        ...

    async def run_cypher(
        self, query: str, params: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        """A caller's query, after proving it read-only and scoped
        (deployments.graph_store.guard)."""
        ...

    async def acl_hidden(self, scope: GraphScope) -> bool:
        """Whether some ``Doc`` of the team in ``scope``'s visibilities has an access list
        that does not admit ``scope.acl_principals`` (caller Cypher is refused then)."""
        ...

    async def explain_path(
        self,
        source: dict[str, str],
        target: dict[str, str],
        scope: GraphScope,
        max_hops: int,
        max_paths: int,
    ) -> dict[str, Any]: ...

    async def related_docs(
        self, text: str, scope: GraphScope, max_entities: int, max_docs: int
    ) -> dict[str, Any]:
        """Entities named in ``text`` (full-text index) and the documents linked to them:
        ``{"entities": [...], "docs": {doc_id: weight}}``."""
        ...

    async def status(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Backends:
    """What one gateway process talks to: Serve handles (the ingress), in-process stores (the
    bus consumer) or fakes (tests). ``graph``/``reranker`` ``None``: not deployed."""

    embedder: Embedder
    store: VectorStore
    graph: GraphStore | None = None
    reranker: Reranker | None = None
