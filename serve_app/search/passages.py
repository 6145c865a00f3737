"""What a search derives from a returned passage's text — its word-4-gram shingles (for
near-duplicates) and its sentences with their words (for the snippet) — remembered for the
passages searches return again.

Searches keep returning the same passages (on the AppStream + KJV benchmark 70 % of the
passages 300 different queries returned had been returned before), and these two steps
were a quarter of a lone search's own work (bench/README.md, "Search plumbing, eighth
pass"). An entry is used only for the very text it was made from (checked on every use:
a chunk re-ingested under its id with another text is derived again). The memo is shared
by the replica's callers, but it is consulted only for hits that passed the caller's result
filter and answers only from that hit's own text, so it carries nothing from one caller's
passages to another. Bounded: the least recently used entries go first.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

from batch_ingest.chunks import strip_header
from deployments.protocols import ChunkRecord, SearchHit
from deployments.text import words
from serve_app.search.ranking import shingle_tuples
from serve_app.search.snippets import sentences, snippet_for_terms, snippet_of


class Passage:
    """One chunk's derived text. ``shingles``: hashes of its word-4-grams (a text of at most
    four words: one shingle, itself; none without words). Hashes, not the word tuples, to
    keep an entry small: two different shingles share a 64-bit hash with a probability of
    2^-64 (~1e-15 over all the pairs of two passages), far below any difference a Jaccard of
    0.8 could notice."""

    __slots__ = ("_parts", "_shingles", "body", "remember", "text")

    def __init__(self, chunk: ChunkRecord, remember: bool = True) -> None:
        # remember: False for a passage used once (no memo), derived the cheapest way.
        self.remember = remember
        self.text = chunk.text
        self.body = strip_header(chunk)
        self._shingles: frozenset[int] | None = None
        self._parts: tuple[list[str], list[frozenset[str]]] | None = None

    @property
    def shingles(self) -> frozenset[int]:
        if self._shingles is None:
            self._shingles = frozenset(map(hash, shingle_tuples(words(self.body))))
        return self._shingles

    def snippet(self, query_terms: set[str], max_chars: int) -> str:
        """``snippets.best_snippet`` of this body for a query of ``query_terms``."""
        if not self.remember:
            return snippet_for_terms(self.body, query_terms, max_chars)
        body = self.body.strip()
        if len(body) <= max_chars:
            return body
        if self._parts is None:
            parts = sentences(body)
            # Interned: the words of many passages share one string each.
            self._parts = parts, [frozenset(map(sys.intern, words(p))) for p in parts]
        parts, part_words = self._parts
        return snippet_of(parts, [len(query_terms.intersection(w)) for w in part_words], max_chars)


class PassageMemo:
    """``Passage`` of a hit's chunk, made once per text and kept for ``capacity`` chunks.

    Used from the event loop of one replica; two threads at once at worst derive a passage
    twice."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, Passage] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def of(self, chunk: ChunkRecord) -> Passage:
        entry = self._entries.get(chunk.chunk_id)
        if entry is not None and entry.text == chunk.text:  # an identical object: no scan
            self.hits += 1
            self._entries.move_to_end(chunk.chunk_id)
            return entry
        self.misses += 1
        entry = Passage(chunk, remember=self.capacity > 0)
        if entry.remember:
            self._entries[chunk.chunk_id] = entry
            self._entries.move_to_end(chunk.chunk_id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return entry

    def shingles(self, hit: SearchHit) -> frozenset[int]:
        return self.of(hit.chunk).shingles
