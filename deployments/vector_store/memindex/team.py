"""An exact in-memory index of one team's chunks: dense top-k, BM25 and the compiled filter.

Rows live in slots: a write appends a new slot (an upserted chunk id frees its old one), a
delete frees one; ``_repack`` renumbers the live slots when the dead ones or the BM25 delta
grow, in memory, never per write. Dense search is one matrix–vector product over the slots
(exact, so at least as good as Milvus's HNSW); BM25 is ``BM25Postings``; both are restricted
by the row mask of the same ``CompiledFilter`` terms that become the Milvus expression, built
from the filter columns of the slots (``FilterColumns``, columns.py) and cached here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from deployments.protocols import ChunkRecord, SearchHit
from deployments.vector_store.filter import CompiledFilter, FilterTerm
from deployments.vector_store.memindex.bm25 import BM25Postings
from deployments.vector_store.memindex.columns import FilterColumns
from deployments.vector_store.memindex.int8 import Int8Pass
from deployments.vector_store.memindex.scan import DenseScan

MASK_CACHE = 32
RECORD_OVERHEAD = 700  # bytes of a ChunkRecord and its strings beyond the text itself


class TeamIndex:
    """One team's chunks (one physical collection) in memory; thread-safe.

    Args:
        dim: vector size.
        metric: the collection's dense metric (``COSINE``, ``IP`` or ``L2``), so scores are
            the ones Milvus would return.
        k1, b: BM25 parameters.
        scan: the dense scan (shared by the teams of one ``HotIndex``; its threads); one
            thread when not given.
    """

    def __init__(
        self,
        *,
        dim: int,
        metric: str = "COSINE",
        k1: float = 1.5,
        b: float = 0.75,
        scan: DenseScan | None = None,
    ):
        self.dim = dim
        self.metric = metric
        self._scan = scan or DenseScan()
        # The int8 first pass of the dense scan (a dot product's: not for L2).
        self._int8 = Int8Pass(dim, self._scan) if self._scan.int8 and metric != "L2" else None
        self._lock = threading.RLock()
        self._size = 0  # slots used, live or dead
        self._vectors = np.zeros((0, dim), dtype=np.float32)
        self._alive = np.zeros(0, dtype=bool)
        self._columns = FilterColumns()  # what the filter terms read, per slot
        self._records: list[ChunkRecord | None] = []
        self._slot: dict[str, int] = {}
        self._text_bytes = 0
        self._bm25 = BM25Postings(k1, b)
        self._masks: OrderedDict[tuple[FilterTerm, ...], np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self._slot

    @property
    def nbytes(self) -> int:
        """Estimated memory held (the budget of ``HotIndex`` counts this)."""
        return int(
            self._vectors.nbytes
            + self._columns.nbytes
            + self._alive.nbytes
            + self._bm25.nbytes
            + (self._int8.nbytes if self._int8 is not None else 0)
            + self._text_bytes
            + RECORD_OVERHEAD * len(self._slot)
        )

    # --- writes ------------------------------------------------------------------------
    def upsert(self, chunks: Iterable[ChunkRecord]) -> None:
        """Add or replace chunks (each with its vector)."""
        batch = list(chunks)
        if not batch:
            return
        vectors = np.asarray([c.vector for c in batch], dtype=np.float32).reshape(-1, self.dim)
        if self.metric == "COSINE":
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)
        with self._lock:
            self._reserve(self._size + len(batch))
            for chunk, vector in zip(batch, vectors, strict=True):
                self._drop(chunk.chunk_id)
                self._append(chunk, vector)
            self._changed()

    def apply(self, rows: Iterable[ChunkRecord], removed: Iterable[str]) -> None:
        """Upsert ``rows`` and remove ``removed`` in one step: a search sees neither or both
        (a replay of the change log)."""
        with self._lock:
            self.upsert(rows)
            self.remove(removed)

    def remove(self, chunk_ids: Iterable[str]) -> int:
        with self._lock:
            removed = sum(self._drop(cid) for cid in chunk_ids)
            if removed:
                self._changed()
            return removed

    def _reserve(self, slots: int) -> None:
        capacity = self._alive.size
        if slots <= capacity:
            return
        new = max(slots, 2 * capacity, 256)
        grow = new - capacity
        self._vectors = np.concatenate([self._vectors, np.zeros((grow, self.dim), np.float32)])
        self._alive = np.concatenate([self._alive, np.zeros(grow, bool)])
        self._columns.grow(grow)

    def _append(self, chunk: ChunkRecord, vector: np.ndarray) -> None:
        slot = self._size
        self._size += 1
        self._vectors[slot] = vector
        self._alive[slot] = True
        self._columns.add(slot, chunk)
        self._records.append(replace(chunk, vector=(), lexical=None))
        self._slot[chunk.chunk_id] = slot
        self._text_bytes += len(chunk.text)
        self._bm25.add(slot, chunk.text)

    def _drop(self, chunk_id: str) -> bool:
        slot = self._slot.pop(chunk_id, None)
        if slot is None:
            return False
        record = self._records[slot]
        assert record is not None
        self._alive[slot] = False
        self._columns.discard(slot, record)
        self._records[slot] = None
        self._text_bytes -= len(record.text)
        self._bm25.remove(slot)
        return True

    def _changed(self) -> None:
        self._masks.clear()
        dead = self._size - len(self._slot)
        bm25 = self._bm25
        if (dead > 256 and dead > self._size // 4) or (
            bm25.delta_postings > max(50_000, bm25.frozen_postings // 4)
        ):
            self._repack()

    def _repack(self) -> None:
        """Renumber the live slots 0..n-1 and rebuild the BM25 block over them."""
        live = np.flatnonzero(self._alive[: self._size])
        renumber = {int(old): new for new, old in enumerate(live)}
        self._vectors = self._vectors[live].copy()
        self._alive = np.ones(live.size, dtype=bool)
        self._columns.renumber(live, renumber)
        self._records = [self._records[int(s)] for s in live]
        self._slot = {cid: renumber[s] for cid, s in self._slot.items()}
        self._size = int(live.size)
        if self._int8 is not None:
            self._int8.reset()
        self._bm25.rebuild(renumber)

    # --- reads -------------------------------------------------------------------------
    def _mask(self, terms: tuple[FilterTerm, ...]) -> np.ndarray:
        cached = self._masks.get(terms)
        if cached is not None:
            self._masks.move_to_end(terms)
            return cached
        mask = self._columns.mask(terms, self._alive, self._size)
        self._masks[terms] = mask
        if len(self._masks) > MASK_CACHE:
            self._masks.popitem(last=False)
        return mask

    def search(
        self,
        method: str,
        flt: CompiledFilter,
        limit: int,
        *,
        query_text: str = "",
        query_vector: list[float] | None = None,
    ) -> list[SearchHit]:
        """The top ``limit`` chunks of ``method`` (``dense`` or ``bm25``) among the rows
        ``flt`` admits, best first, scored as Milvus scores them."""
        with self._lock:
            mask = self._mask(flt.terms)
            if method == "dense":
                if query_vector is None:
                    raise ValueError("dense search needs a query vector")
                query = np.asarray(query_vector, dtype=np.float32)
                if self.metric == "COSINE":
                    norm = float(np.linalg.norm(query))
                    query = query / norm if norm > 0 else query
                found = (
                    self._int8.top(self._vectors, self._size, query, mask, limit)
                    if self._int8 is not None
                    else None
                )
                if found is not None:  # the rows that can be in the top, float32 scores
                    slots, scores = found
                else:
                    slots = np.flatnonzero(mask)
                    scores = self._dense_scores(query)[slots]
            else:
                bm25 = self._bm25.scores(query_text, self._size)
                if bm25 is None:
                    return []
                slots = np.flatnonzero(mask & (bm25 > 0))
                scores = bm25[slots]
            best = _best(scores, limit, ascending=method == "dense" and self.metric == "L2")
            hits = []
            for slot, score in zip(slots[best].tolist(), scores[best].tolist(), strict=True):
                record = self._records[slot]
                assert record is not None  # picked slots are live
                hits.append(SearchHit.of(record, score, {method: score}))
            return hits

    def search_methods(
        self,
        methods: tuple[str, ...],
        flt: CompiledFilter,
        limit: int,
        *,
        query_text: str = "",
        query_vector: list[float] | None = None,
    ) -> dict[str, list[SearchHit]]:
        """``search`` of each method over one state of the index (no write between them)."""
        with self._lock:
            return {
                method: self.search(
                    method, flt, limit, query_text=query_text, query_vector=query_vector
                )
                for method in methods
            }

    def prepare_scan(self) -> None:
        """Make what the dense scan keeps besides the rows (the int8 blocks) now, not in the
        next search."""
        with self._lock:
            if self._int8 is not None:
                self._int8.prepare(self._vectors, self._size)

    def _dense_scores(self, query: np.ndarray) -> np.ndarray:
        """Every slot's score (a COSINE query comes normalised)."""
        vectors = self._vectors[: self._size]
        dots = self._scan.scores(vectors, query)
        if self.metric in ("COSINE", "IP"):
            return dots
        # L2: Milvus reports the squared distance, smaller is closer.
        return (vectors * vectors).sum(axis=1) - 2.0 * dots + float(query @ query)


def _best(scores: np.ndarray, limit: int, *, ascending: bool) -> np.ndarray:
    """Positions of the ``limit`` best ``scores`` (of slots given in increasing order), best
    first; ties by position, so by slot (insertion)."""
    if scores.size == 0 or limit <= 0:
        return np.zeros(0, dtype=np.int64)
    keys = scores if ascending else -scores
    positions = np.arange(scores.size)
    if scores.size > limit:
        positions = np.argpartition(keys, limit - 1)[:limit]
    return positions[np.lexsort((positions, keys[positions]))]
