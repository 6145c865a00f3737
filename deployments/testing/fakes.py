"""Deterministic in-memory fakes of the backend protocols in ``deployments.protocols``.

They let the pipeline, the service and the HTTP layer run without Ray, Milvus, Neo4j or a
model. Vectors come from SHA-256 (never Python's salted ``hash``), so every run and every
process sees the same numbers. The vector store evaluates a ``SearchFilter`` term by term the
way ``deployments.vector_store.filter.build_filter_expr`` compiles it for Milvus, and validates
it by calling that very function, so a filter Milvus would refuse is refused here too.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from deployments import acl
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import (
    ChunkRecord,
    Encoded,
    GraphDocument,
    GraphScope,
    SearchFilter,
    SearchHit,
)
from deployments.vector_store.filter import build_filter_expr, compile_filter

WORD = re.compile(r"\w+", re.UNICODE)


# What the fakes' search() answers: the store's methods, and dense + BM25 fused.
SEARCH_MODES = ("hybrid", "dense", "bm25", "lexical")


def words(text: str) -> list[str]:
    """Lower-cased word tokens; what the fakes treat as terms."""
    return [w.lower() for w in WORD.findall(text)]


def sha256_unit_vector(key: str, dim: int) -> list[float]:
    """A unit vector in ``dim`` dimensions derived only from SHA-256 of ``key``."""
    values: list[float] = []
    counter = 0
    while len(values) < dim:
        digest = hashlib.sha256(f"{counter}:{key}".encode()).digest()
        # Two bytes per component, centred on zero.
        for i in range(0, len(digest), 2):
            values.append(int.from_bytes(digest[i : i + 2], "big") / 32767.5 - 1.0)
        counter += 1
    values = values[:dim]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a)) or 1.0
    nb = math.sqrt(sum(y * y for y in b)) or 1.0
    return dot / (na * nb)


class FakeEmbedder:
    """Bag-of-words embedder: the sum of one SHA-256 vector per word, normalised.

    Texts sharing words get similar vectors, so dense search behaves sensibly; a text with no
    word characters gets the SHA-256 vector of the whole text. ``down = True`` makes every
    call raise ``BackendUnavailable`` like a dead embedder replica. With ``lexical`` its
    ``encode`` also makes learned-sparse-like weights: a word's id (from SHA-256) → how
    often it occurs, as BGE-M3's head gives one weight per distinct token.
    """

    def __init__(
        self, dim: int = 32, *, model: str = "fake-embedder@v1", lexical: bool = False
    ) -> None:
        self.dim = dim
        self.model = model
        self.lexical = lexical
        self.down = False
        self.calls: list[tuple[list[str], str]] = []

    @property
    def embedded_texts(self) -> list[str]:
        return [text for texts, _ in self.calls for text in texts]

    def vector(self, text: str) -> list[float]:
        tokens = words(text)
        if not tokens:
            return sha256_unit_vector("text:" + text, self.dim)
        total = [0.0] * self.dim
        for token in tokens:
            for i, value in enumerate(sha256_unit_vector("word:" + token, self.dim)):
                total[i] += value
        norm = math.sqrt(sum(v * v for v in total)) or 1.0
        return [v / norm for v in total]

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        if self.down:
            raise BackendUnavailable("embedder", "fake embedder is down")
        if kind not in ("query", "passage"):
            raise InvalidInput(f"kind must be 'query' or 'passage', got {kind!r}")
        self.calls.append((list(texts), kind))
        return [self.vector(text) for text in texts]

    @staticmethod
    def weights(text: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for token in words(text):
            token_id = int.from_bytes(hashlib.sha256(token.encode()).digest()[:3], "big")
            out[token_id] = out.get(token_id, 0.0) + 1.0
        return out

    async def encode(self, texts: list[str], kind: str = "passage") -> Encoded:
        vectors = await self.embed(texts, kind)
        dense = np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)
        return Encoded(dense, [self.weights(t) for t in texts] if self.lexical else None)

    async def status(self) -> dict[str, Any]:
        if self.down:
            return {"ready": False, "model": self.model, "dim": self.dim, "error": "down"}
        return {"ready": True, "model": self.model, "dim": self.dim}


class FakeReranker:
    """Scores a passage by how many distinct query words it contains, plus a tiny
    SHA-256-derived tie-breaker so the order is total and stable."""

    def __init__(self) -> None:
        self.down = False
        self.calls: list[tuple[str, list[str]]] = []

    @staticmethod
    def score(query: str, text: str) -> float:
        overlap = len(set(words(query)) & set(words(text)))
        tie = int.from_bytes(hashlib.sha256(text.encode()).digest()[:2], "big") / 65536 / 1000
        return float(overlap) + tie

    async def rerank(self, query: str, texts: list[str]) -> list[float]:
        if self.down:
            raise BackendUnavailable("reranker", "fake reranker is down")
        self.calls.append((query, list(texts)))
        return [self.score(query, text) for text in texts]

    async def status(self) -> dict[str, Any]:
        return {"ready": not self.down, "model": "fake-reranker"}


def matches_filter(chunk: ChunkRecord, flt: SearchFilter) -> bool:
    """The Python twin of ``build_filter_expr``: one check per term it would emit."""
    if chunk.team_id != flt.team_id:
        return False
    if chunk.visibility not in flt.visibilities:
        return False
    for name in ("project_id", "channel_id", "agent_id"):
        wanted = getattr(flt, name)
        if wanted is not None and getattr(chunk, name) != wanted:
            return False
    if flt.doc_types and chunk.doc_type not in flt.doc_types:
        return False
    if flt.tags_any and not set(chunk.tags) & set(flt.tags_any):
        return False
    if flt.tags_all and not set(flt.tags_all) <= set(chunk.tags):
        return False
    if flt.created_from is not None and chunk.created_at < int(flt.created_from):
        return False
    if flt.doc_ids and chunk.doc_id not in flt.doc_ids:
        return False
    if not acl.admits(chunk.acl_allow, chunk.acl_deny, flt.acl_principals):
        return False
    return not (flt.created_to is not None and chunk.created_at > int(flt.created_to))


class FakeVectorStore:
    """An in-memory chunk collection keyed by ``chunk_id``.

    Args:
        fail_on_upsert: the 1-based number of the ``upsert`` call that raises
            ``BackendUnavailable`` (a crash half-way through a batch); ``None`` never fails.
        rrf_k: the RRF constant used by hybrid search.

    ``down = True`` makes every call raise ``BackendUnavailable``.
    """

    def __init__(self, *, fail_on_upsert: int | None = None, rrf_k: int = 60) -> None:
        self.rows: dict[str, ChunkRecord] = {}
        self.fail_on_upsert = fail_on_upsert
        self.rrf_k = rrf_k
        self.down = False
        self.upsert_calls = 0
        self.searches: list[tuple[str, SearchFilter, int, str]] = []

    def _check_up(self, what: str) -> None:
        if self.down:
            raise BackendUnavailable("milvus", f"{what} failed: fake store is down")

    async def upsert(self, chunks: list[ChunkRecord]) -> int:
        self._check_up("upsert")
        self.upsert_calls += 1
        if self.fail_on_upsert is not None and self.upsert_calls == self.fail_on_upsert:
            raise BackendUnavailable("milvus", f"upsert failed: crash on call {self.upsert_calls}")
        for chunk in chunks:
            self.rows[chunk.chunk_id] = chunk
        return len(chunks)

    def _doc_rows(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        return [
            c
            for c in self.rows.values()
            if (c.team_id, c.doc_type, c.doc_id) == (team_id, doc_type, doc_id)
        ]

    async def lookup(self, team_id: str, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        self._check_up("lookup")
        return {
            cid: (self.rows[cid].content_hash, self.rows[cid].embed_model)
            for cid in chunk_ids
            if cid in self.rows and self.rows[cid].team_id == team_id
        }

    async def stored_chunks(self, team_id: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        self._check_up("query")
        return [
            self.rows[cid]
            for cid in chunk_ids
            if cid in self.rows and self.rows[cid].team_id == team_id
        ]

    async def delete_chunks(self, team_id: str, chunk_ids: list[str]) -> int:
        self._check_up("delete")
        for cid in chunk_ids:
            if cid in self.rows and self.rows[cid].team_id == team_id:
                del self.rows[cid]
        return len(chunk_ids)

    async def delete_stale_chunks(
        self, team_id: str, doc_type: str, doc_id: str, keep: list[str]
    ) -> int:
        self._check_up("delete")
        kept = set(keep)
        stale = [
            c.chunk_id for c in self._doc_rows(team_id, doc_type, doc_id) if c.chunk_id not in kept
        ]
        for chunk_id in stale:
            del self.rows[chunk_id]
        return len(stale)

    async def fingerprints(
        self, docs: list[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], list[tuple[str, str, str]]]:
        out = {}
        for team_id, doc_type, doc_id in docs:
            chunks = await self.get_chunks(team_id, doc_type, doc_id)
            out[(team_id, doc_type, doc_id)] = [
                (c.chunk_id, c.content_hash, c.embed_model) for c in chunks
            ]
        return out

    async def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        self._check_up("query")
        rows = self._doc_rows(team_id, doc_type, doc_id)
        return [replace(c, vector=()) for c in sorted(rows, key=lambda c: c.chunk_index)]

    def _dense(
        self, vector: list[float], pool: list[ChunkRecord]
    ) -> list[tuple[ChunkRecord, float]]:
        scored = [(c, cosine(vector, list(c.vector))) for c in pool if c.vector]
        return sorted(scored, key=lambda cs: (-cs[1], cs[0].chunk_id))

    @staticmethod
    def _bm25(query: str, pool: list[ChunkRecord]) -> list[tuple[ChunkRecord, float]]:
        wanted = set(words(query))
        scored = [(c, float(len(wanted & set(words(c.text))))) for c in pool]
        # Like a sparse index, chunks sharing no term with the query are not returned.
        return sorted(((c, s) for c, s in scored if s > 0), key=lambda cs: (-cs[1], cs[0].chunk_id))

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
        generation: int | None = None,  # always current: nothing to skip
    ) -> dict[str, list[SearchHit]]:
        return {
            m: await self.search(query_text, query_vector, flt, limit, m, query_lexical)
            for m in methods
        }

    async def search(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        mode: str,
        query_lexical: Mapping[int, float] | None = None,
    ) -> list[SearchHit]:
        self._check_up("search")
        if mode not in SEARCH_MODES:
            raise InvalidInput(f"mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if mode == "lexical":
            if query_lexical is None:
                raise InvalidInput("mode 'lexical' needs the query's learned sparse weights")
            self.searches.append((query_text, flt, limit, mode))
            pool = [c for c in self.rows.values() if matches_filter(c, flt) and c.lexical]
            scored = [
                (c, sum(w * (c.lexical or {}).get(t, 0.0) for t, w in query_lexical.items()))
                for c in pool
            ]
            ranked = sorted(
                ((c, s) for c, s in scored if s > 0), key=lambda cs: (-cs[1], cs[0].chunk_id)
            )[:limit]
            return [
                SearchHit(chunk=replace(c, vector=(), lexical=None), score=s, scores={mode: s})
                for c, s in ranked
            ]
        if mode != "bm25" and query_vector is None:
            raise InvalidInput(f"mode {mode!r} needs a query vector")
        build_filter_expr(flt)  # the same validation (team, visibilities, literals) as Milvus
        self.searches.append((query_text, flt, limit, mode))
        pool = [c for c in self.rows.values() if matches_filter(c, flt)]
        if mode == "dense":
            ranked = self._dense(query_vector or [], pool)[:limit]
        elif mode == "bm25":
            ranked = self._bm25(query_text, pool)[:limit]
        else:
            fused: dict[str, float] = {}
            by_id: dict[str, ChunkRecord] = {}
            for ranking in (
                self._dense(query_vector or [], pool)[:limit],
                self._bm25(query_text, pool)[:limit],
            ):
                for rank, (chunk, _) in enumerate(ranking, start=1):
                    by_id[chunk.chunk_id] = chunk
                    fused[chunk.chunk_id] = fused.get(chunk.chunk_id, 0.0) + 1.0 / (
                        self.rrf_k + rank
                    )
            order = sorted(fused, key=lambda cid: (-fused[cid], cid))[:limit]
            ranked = [(by_id[cid], fused[cid]) for cid in order]
        return [
            SearchHit(chunk=replace(c, vector=()), score=score, scores={mode: score})
            for c, score in ranked
        ]

    async def count(self, team_id: str) -> int:
        self._check_up("count")
        return sum(1 for c in self.rows.values() if c.team_id == team_id)

    async def status(self) -> dict[str, Any]:
        if self.down:
            return {"ready": False, "error": "fake store is down"}
        return {"ready": True, "rows": len(self.rows)}


class FakeGraphStore:
    """Records merged documents by ``(team_id, doc_id)``; ``down = True`` fails like Neo4j.

    Graph queries answer what a test put in ``results`` (keyed by intent name, ``"cypher"``,
    ``"path"`` or ``"related"``) and record each call with its scope in ``calls``;
    ``acl_hidden`` answers ``hidden`` (set it to pretend the team holds documents the
    caller's ACL tokens do not admit). The real queries run against Neo4j in
    tests/integration."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], GraphDocument] = {}
        self.down = False
        self.merge_calls = 0
        self.entities: list[tuple[str, list, list]] = []
        self.results: dict[str, Any] = {}
        self.calls: list[tuple[str, Any, GraphScope]] = []
        self.hidden = False

    def _check_up(self) -> None:
        if self.down:
            raise BackendUnavailable("neo4j", "query failed: fake graph is down")

    async def merge_documents(self, docs: list[GraphDocument]) -> int:
        self._check_up()
        self.merge_calls += 1
        for doc in docs:
            self.docs[(doc.team_id, doc.doc_id)] = doc
        return len(docs)

    async def delete_documents(self, team_id: str, doc_ids: list[str]) -> int:
        self._check_up()
        gone = [k for k in self.docs if k[0] == team_id and k[1] in set(doc_ids)]
        for k in gone:
            del self.docs[k]
        return len(gone)

    async def upsert_entities(
        self,
        team_id: str,
        nodes: list[dict[str, Any]],
        relationships: list[dict[str, Any]],
        scope: GraphScope,
    ) -> dict[str, Any]:
        """Records the write; ``results["upsert"]`` (a dict) overrides parts of the answer
        (e.g. ``refused``, ``changes``)."""
        self._check_up()
        self.calls.append(("upsert", None, scope))
        self.entities.append((team_id, nodes, relationships))
        return {
            "nodes": len(nodes),
            "relationships": len(relationships),
            "refused": [],
            "changes": [],
            "derived_ends": [],
            **self.results.get("upsert", {}),
        }

    async def run_intent(
        self, name: str, args: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        self._check_up()
        self.calls.append((name, args, scope))
        return self.results.get(name, {"columns": [], "rows": []})

    async def run_cypher(
        self, query: str, params: dict[str, Any], scope: GraphScope
    ) -> dict[str, Any]:
        self._check_up()
        self.calls.append(("cypher", (query, params), scope))
        result = self.results.get("cypher", {"columns": [], "rows": []})
        if isinstance(result, Exception):
            raise result
        return result

    async def acl_hidden(self, scope: GraphScope) -> bool:
        self._check_up()
        self.calls.append(("acl_hidden", None, scope))
        return self.hidden

    async def explain_path(
        self,
        source: dict[str, Any],
        target: dict[str, Any],
        scope: GraphScope,
        max_hops: int,
        max_paths: int,
    ) -> dict[str, Any]:
        self._check_up()
        self.calls.append(("path", (source, target, max_hops, max_paths), scope))
        return self.results.get("path", {"source": [], "target": [], "paths": []})

    async def related_docs(
        self, text: str, scope: GraphScope, max_entities: int, max_docs: int
    ) -> dict[str, Any]:
        self._check_up()
        self.calls.append(("related", text, scope))
        return self.results.get("related", {"entities": [], "docs": {}})

    async def status(self) -> dict[str, Any]:
        if self.down:
            return {"ready": False, "error": "fake graph is down"}
        return {"ready": True, "nodes": len(self.docs)}


class MemoryIndexStore(FakeVectorStore):
    """``FakeVectorStore`` whose dense and BM25 searches run on the Retriever's real
    in-memory index (``deployments.vector_store.memindex.team.TeamIndex``) holding the rows of
    *every* team, so only the compiled filter keeps a search inside its tenant — what the leak
    probes and tenancy tests check of the memory-index path."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version = 0
        self._index: Any = None
        self._indexed = -1

    async def upsert(self, chunks: list[ChunkRecord]) -> int:
        self.version += 1
        return await super().upsert(chunks)

    async def delete_chunks(self, team_id: str, chunk_ids: list[str]) -> int:
        self.version += 1
        return await super().delete_chunks(team_id, chunk_ids)

    async def delete_stale_chunks(
        self, team_id: str, doc_type: str, doc_id: str, keep: list[str]
    ) -> int:
        self.version += 1
        return await super().delete_stale_chunks(team_id, doc_type, doc_id, keep)

    def _current(self) -> Any:
        from deployments.vector_store.memindex.team import TeamIndex

        if self._indexed != self.version:
            rows = [c for c in self.rows.values() if c.vector]
            dim = len(rows[0].vector) if rows else 1
            self._index = TeamIndex(dim=dim)
            self._index.upsert(rows)
            self._indexed = self.version
        return self._index

    async def search(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        mode: str,
        query_lexical: Mapping[int, float] | None = None,
    ) -> list[SearchHit]:
        if mode in ("hybrid", "lexical"):
            return await super().search(query_text, query_vector, flt, limit, mode, query_lexical)
        self._check_up("search")
        if mode not in SEARCH_MODES:
            raise InvalidInput(f"mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if mode == "dense" and query_vector is None:
            raise InvalidInput("mode 'dense' needs a query vector")
        compiled = compile_filter(flt)
        self.searches.append((query_text, flt, limit, mode))
        return self._current().search(
            mode, compiled, limit, query_text=query_text, query_vector=query_vector
        )


def allow_batch_queue_outside_serve() -> None:
    """Let a Serve shell's ``@serve.batch`` queue run in a plain event loop (tests,
    benchmarks): its one check of the replica's ``max_ongoing_requests`` (a warning only)
    needs a replica context; everything else of the queue runs as is. Idempotent."""
    from ray.serve import batching

    queue: Any = batching._BatchQueue
    queue._warn_if_max_batch_size_exceeds_max_ongoing_requests = lambda self: None
