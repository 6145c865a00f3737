"""Incremental BM25 postings of one team's chunks.

Scoring follows Milvus's BM25 function: ``IDF(t) = log(1 + (N - df + 0.5) / (df + 0.5))``,
``tf·(k1+1) / (tf + k1·(1 - b + b·dl/avgdl))`` per matching term, times the term's count in
the query; ``dl`` is a chunk's token count, ``N``, ``df`` and ``avgdl`` count live chunks
only (collection-wide statistics, where Milvus Lite uses each segment's own). Tokens are
Milvus's ``standard`` analyzer as Milvus Lite implements it: ``\\w+`` runs, lower-cased.

Postings live in one CSR block (term → slots, term frequencies) plus a small per-term delta
for chunks added since; ``TeamIndex`` rebuilds the block when the delta or the dead slots
grow (``rebuild``), never per write.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from deployments.text import words


class BM25Postings:
    """Term statistics and postings over integer slots (rows of a ``TeamIndex``).

    Args:
        k1: term-frequency saturation (Milvus's ``bm25_k1``).
        b: length normalisation (Milvus's ``bm25_b``).
    """

    def __init__(self, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self._vocab: dict[str, int] = {}
        self._df = np.zeros(0, dtype=np.int64)
        # Frozen postings: term t's slots are _slots[_indptr[t]:_indptr[t + 1]].
        self._indptr = np.zeros(1, dtype=np.int64)
        self._slots = np.zeros(0, dtype=np.int32)
        self._tfs = np.zeros(0, dtype=np.float32)
        self._delta: dict[int, tuple[list[int], list[float]]] = {}
        self.delta_postings = 0
        # Per slot: its term ids and frequencies (for removal and rebuilds); its length.
        self._terms: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._terms_bytes = 0
        self._doclen = np.zeros(0, dtype=np.float32)
        self.docs = 0
        self.total_len = 0.0

    @property
    def frozen_postings(self) -> int:
        return int(self._slots.size)

    @property
    def nbytes(self) -> int:
        per_slot = self._terms_bytes
        return int(
            self._slots.nbytes
            + self._tfs.nbytes
            + self._indptr.nbytes
            + self._df.nbytes
            + self._doclen.nbytes
            + per_slot
            + 24 * self.delta_postings
            + 80 * len(self._vocab)
        )

    def _term_ids(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        counts = Counter(words(text))
        vocab = self._vocab
        ids = np.empty(len(counts), dtype=np.int32)
        for i, term in enumerate(counts):
            tid = vocab.get(term)
            if tid is None:
                tid = vocab[term] = len(vocab)
            ids[i] = tid
        return ids, np.fromiter(counts.values(), dtype=np.float32, count=len(counts))

    def _grow(self, slots: int) -> None:
        if len(self._vocab) > self._df.size:
            extra = max(len(self._vocab) - self._df.size, self._df.size, 1024)
            self._df = np.concatenate([self._df, np.zeros(extra, np.int64)])
        if slots > self._doclen.size:
            extra = max(slots - self._doclen.size, self._doclen.size, 1024)
            self._doclen = np.concatenate([self._doclen, np.zeros(extra, np.float32)])

    def add(self, slot: int, text: str) -> None:
        """Index ``text`` as the content of a new ``slot``."""
        ids, tfs = self._term_ids(text)
        self._grow(slot + 1)
        self._terms[slot] = (ids, tfs)
        self._terms_bytes += ids.nbytes + tfs.nbytes
        np.add.at(self._df, ids, 1)
        length = float(tfs.sum())
        self._doclen[slot] = length
        self.total_len += length
        self.docs += 1
        for tid, tf in zip(ids.tolist(), tfs.tolist(), strict=True):
            entry = self._delta.get(tid)
            if entry is None:
                entry = self._delta[tid] = ([], [])
            entry[0].append(slot)
            entry[1].append(tf)
        self.delta_postings += len(ids)

    def remove(self, slot: int) -> None:
        """Forget ``slot``'s statistics; its postings stay until ``rebuild`` (the caller
        masks dead slots)."""
        entry = self._terms.pop(slot, None)
        if entry is None:
            return
        ids, tfs = entry
        self._terms_bytes -= ids.nbytes + tfs.nbytes
        np.subtract.at(self._df, ids, 1)
        self.total_len -= float(tfs.sum())
        self.docs -= 1

    def rebuild(self, renumber: dict[int, int]) -> None:
        """Rebuild the frozen block over the live slots, renamed ``old → new``."""
        terms = {renumber[s]: self._terms[s] for s in sorted(renumber) if s in self._terms}
        self._terms = terms
        doclen = np.zeros(max(len(renumber), 1024), np.float32)
        for new, (_, tfs) in terms.items():
            doclen[new] = tfs.sum()
        self._doclen = doclen
        self._delta, self.delta_postings = {}, 0
        if not terms:
            self._indptr = np.zeros(len(self._vocab) + 1, np.int64)
            self._slots, self._tfs = np.zeros(0, np.int32), np.zeros(0, np.float32)
            return
        sizes = [ids.size for ids, _ in terms.values()]
        all_ids = np.concatenate([ids for ids, _ in terms.values()])
        all_tfs = np.concatenate([tfs for _, tfs in terms.values()])
        all_slots = np.repeat(np.fromiter(terms, dtype=np.int32, count=len(terms)), sizes)
        order = np.argsort(all_ids, kind="stable")
        self._slots, self._tfs = all_slots[order], all_tfs[order]
        counts = np.bincount(all_ids, minlength=len(self._vocab))
        self._indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def _postings(self, tid: int) -> tuple[np.ndarray, np.ndarray]:
        if tid + 1 < self._indptr.size:
            lo, hi = self._indptr[tid], self._indptr[tid + 1]
            slots, tfs = self._slots[lo:hi], self._tfs[lo:hi]
        else:
            slots, tfs = self._slots[:0], self._tfs[:0]
        extra = self._delta.get(tid)
        if extra is not None:
            slots = np.concatenate([slots, np.asarray(extra[0], np.int32)])
            tfs = np.concatenate([tfs, np.asarray(extra[1], np.float32)])
        return slots, tfs

    def scores(self, query: str, size: int) -> np.ndarray | None:
        """BM25 score of every slot below ``size`` (dead slots included: mask them), or
        ``None`` when no query term occurs in a live chunk."""
        if self.docs <= 0:
            return None
        n = float(self.docs)
        avgdl = self.total_len / n if self.total_len > 0 else 1.0
        k1, b = self.k1, self.b
        acc: np.ndarray | None = None
        for term, weight in Counter(words(query)).items():
            tid = self._vocab.get(term)
            if tid is None or self._df[tid] <= 0:
                continue
            df = float(self._df[tid])
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            slots, tfs = self._postings(tid)
            norm = k1 * (1.0 - b + b * self._doclen[slots] / avgdl)
            if acc is None:
                acc = np.zeros(size, dtype=np.float32)
            acc[slots] += (idf * weight) * tfs * (k1 + 1.0) / (tfs + norm)
        return acc
