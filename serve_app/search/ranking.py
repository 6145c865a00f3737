"""The query pipeline after retrieval: fusion, near-duplicate removal, score threshold and
token budget. Pure functions over ``SearchHit`` lists (fusion answers a ``Fused`` sequence that
makes each hit when it is read), so each step is tested on its own."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import overload

from deployments.protocols import SearchHit
from deployments.text import words as text_words


def fuse_rrf(
    lists: dict[str, list[SearchHit]], k: int = 60, weights: dict[str, float] | None = None
) -> Fused:
    """Reciprocal-rank fusion: ``sum_m w_m / (k + rank_m)``; rank-based, so methods whose
    scores live on different scales (cosine, BM25) combine without calibration."""
    fused: dict[str, float] = {}
    first: dict[str, SearchHit] = {}
    raw: dict[str, dict[str, float]] = {}
    for method, hits in lists.items():
        weight = 1.0 if weights is None else weights.get(method, 0.0)
        of_method = raw[method] = {}
        for rank, hit in enumerate(hits, start=1):
            cid = hit.chunk.chunk_id
            if cid not in first:
                first[cid] = hit
            fused[cid] = fused.get(cid, 0.0) + weight / (k + rank)
            of_method[cid] = hit.score
    return Fused(first, fused, raw, "rrf")


# The lowest score each method can give: cosine similarity (COSINE/IP on unit vectors) and BM25.
THEORETICAL_MIN = {"dense": -1.0, "bm25": 0.0}


def fuse_weighted(
    lists: dict[str, list[SearchHit]],
    weights: dict[str, float],
    normalisation: str = "minmax",
    lower_bounds: dict[str, float] | None = None,
) -> Fused:
    """Weighted sum of per-method scores, each normalised over its own candidates (a method
    that did not return a chunk contributes 0 for it).

    ``minmax`` maps each list's lowest..highest score to 0..1, so even a list of nearly equal
    scores (a method that is unsure) is stretched to full range. ``theoretical`` uses the
    method's lowest *possible* score instead of the observed one (``THEORETICAL_MIN``), so an
    unsure method's candidates stay close together and the confident method decides
    (convex combination with theoretical min-max, Bruch et al., TOIS 2023).
    """
    if normalisation not in ("minmax", "theoretical"):
        raise ValueError(f"normalisation must be minmax or theoretical, got {normalisation!r}")
    bounds = {**THEORETICAL_MIN, **(lower_bounds or {})}
    fused: dict[str, float] = {}
    first: dict[str, SearchHit] = {}
    raw: dict[str, dict[str, float]] = {}
    for method, hits in lists.items():
        if not hits:
            continue
        scores = [h.score for h in hits]
        high = max(scores)
        low = min(scores) if normalisation == "minmax" else min(bounds.get(method, 0.0), high)
        span = high - low
        weight = weights.get(method, 0.0)
        of_method = raw[method] = {}
        for hit, score in zip(hits, scores, strict=True):
            cid = hit.chunk.chunk_id
            if cid not in first:
                first[cid] = hit
            normalised = (score - low) / span if span > 0 else 1.0
            fused[cid] = fused.get(cid, 0.0) + weight * normalised
            of_method[cid] = score
    return Fused(first, fused, raw, "weighted")


def list_confidence(hits: list[SearchHit], k: int = 10, measure: str = "peak") -> float:
    """How clearly a method's best candidate stands out of its own list, in 0..1.

    ``relgap`` is the drop from the best score to the k-th, relative to the best
    (``(s1 − sk) / |s1|``, clipped to 0..1): on the labeled sets of bench/quality it was about
    twice as large for queries whose first candidate was right as for those whose first was
    wrong, for cosine and BM25 alike. ``peak`` and ``margin`` min-max normalise the scores over
    the method's candidates first; ``peak`` is 1 − the mean normalised score of ranks 2..k (a
    flat list gives ~0, one clear winner ~1), ``margin`` the normalised gap between ranks 1
    and 2. Fewer than two candidates: 1 (nothing to doubt)."""
    if len(hits) < 2:
        return 1.0
    scores = [h.score for h in hits]
    if measure == "relgap":
        ordered = sorted(scores, reverse=True)
        top, kth = ordered[0], ordered[min(k, len(ordered)) - 1]
        return min(max((top - kth) / abs(top), 0.0), 1.0) if top else 0.0
    high, low = max(scores), min(scores)
    span = high - low
    if span <= 0:
        return 0.0
    ranked = sorted(((x - low) / span for x in scores), reverse=True)
    if measure == "margin":
        return ranked[0] - ranked[1]
    rest = ranked[1:k]
    return 1.0 - sum(rest) / len(rest)


def adaptive_weights(
    lists: dict[str, list[SearchHit]],
    weights: dict[str, float],
    gamma: float = 1.0,
    k: int = 10,
    measure: str = "peak",
) -> dict[str, float]:
    """Per-query weights: each method's base weight times its list's confidence
    (``list_confidence``) to the power ``gamma``, rescaled to the base weights' sum. A method
    whose candidates all look alike for this query (a weak embedder on a foreign script or an
    archaic text; BM25 when no query term is rare) gives way to the one that is sure.
    ``gamma`` 0 returns the base weights."""
    conf = {m: list_confidence(h, k, measure) for m, h in lists.items() if m in weights}
    raw = {m: weights[m] * (conf.get(m, 1.0) ** gamma) for m in weights}
    total_raw = sum(raw.values())
    total = sum(weights.values())
    if total_raw <= 0:
        return dict(weights)
    return {m: w * total / total_raw for m, w in raw.items()}


class Fused(Sequence[SearchHit]):
    """Fusion's answer, best first (ties by chunk id): each hit — the chunk as the first
    list that found it has it, the fused ``score``, and ``scores``, every method's own score
    and the fused one under ``name`` — is made when it is first read. A search reads the
    few dozen that its threshold, near-duplicates and ``top_k`` look at of the ~200 fused;
    a rerank reads them all."""

    __slots__ = ("_first", "_fused", "_raw", "_name", "_order", "_made")

    def __init__(
        self,
        first: dict[str, SearchHit],
        fused: dict[str, float],
        raw: dict[str, dict[str, float]],
        name: str,
    ) -> None:
        self._first = first
        self._fused = fused
        self._raw = raw  # method -> chunk id -> that method's score
        self._name = name
        # Chunk ids sorted, then by score, descending: the sort is stable, so ties stay
        # in chunk-id order.
        order = sorted(fused)
        order.sort(key=fused.__getitem__, reverse=True)
        self._order = order
        self._made: list[SearchHit] = []

    def __len__(self) -> int:
        return len(self._order)

    def _make(self, cid: str) -> SearchHit:
        scores = {m: found[cid] for m, found in self._raw.items() if cid in found}
        scores[self._name] = score = self._fused[cid]
        return SearchHit.of(self._first[cid].chunk, score, scores)

    def _hit(self, position: int) -> SearchHit:
        """The hit at ``position`` (0 ≤ position < len), the ones before it made too."""
        made = self._made
        while len(made) <= position:
            made.append(self._make(self._order[len(made)]))
        return made[position]

    def __iter__(self) -> Iterator[SearchHit]:
        for position in range(len(self._order)):
            yield self._hit(position)

    @overload
    def __getitem__(self, index: int) -> SearchHit: ...

    @overload
    def __getitem__(self, index: slice) -> list[SearchHit]: ...

    def __getitem__(self, index: int | slice) -> SearchHit | list[SearchHit]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += len(self._order)
        if not 0 <= index < len(self._order):
            raise IndexError("fused hit index out of range")
        return self._hit(index)


def shingle_tuples(ws: list[str], size: int = 4) -> Iterable[tuple[str, ...]]:
    """The word-``size``-grams of the words ``ws``; a text of at most ``size`` words is one
    shingle, itself (none without words)."""
    if len(ws) <= size:
        return (tuple(ws),) if ws else ()
    # zip of shifted word lists: the same tuples as slicing, ~1.3x faster.
    return zip(*(ws[i:] for i in range(size)), strict=False)


def shingles(text: str, size: int = 4) -> set[tuple[str, ...]]:
    return set(shingle_tuples(text_words(text), size))


def drop_near_duplicates(
    hits: Iterable[SearchHit],
    shingles_of: Callable[[SearchHit], AbstractSet[Hashable]],
    threshold: float = 0.8,
    limit: int | None = None,
) -> list[SearchHit]:
    """Keep the best-ranked of any group of passages whose word-4-gram shingle sets
    (``shingles_of``: ``shingles`` of its text, or what a ``passages.PassageMemo`` kept of
    it) have a Jaccard similarity ≥ ``threshold`` (re-posted messages, copied sections,
    overlaps).

    ``limit`` stops once that many passages are kept: the caller keeps only the first
    ``top_k`` anyway, and shingling every candidate was the costliest step of a search."""
    kept: list[SearchHit] = []
    originals = _Originals(shingles_of, threshold)
    for hit in hits:
        if limit is not None and len(kept) >= limit:
            break
        if originals.repeated(hit) is None:
            kept.append(hit)
    return kept


def collapse_near_duplicates(
    hits: Iterable[SearchHit],
    shingles_of: Callable[[SearchHit], AbstractSet[Hashable]],
    threshold: float = 0.8,
    limit: int | None = None,
) -> tuple[list[SearchHit], dict[str, str]]:
    """Like ``drop_near_duplicates``, but a passage repeating a kept one of *another
    document* stays, at its rank, as a duplicate: the second result maps its chunk id to the
    chunk id of the passage it repeats (which comes before it). Its source is another place
    the same text is found, which a caller would otherwise never learn; its text adds
    nothing, so the caller need not read or show it again. A repeat of a kept passage by a
    document already among that passage's sources (its own, or an earlier duplicate's) is
    dropped. Duplicates count towards ``limit``; only originals are compared with."""
    kept: list[SearchHit] = []
    duplicate_of: dict[str, str] = {}
    sources: dict[str, set[str]] = {}  # original chunk id -> documents holding its text
    originals = _Originals(shingles_of, threshold)
    for hit in hits:
        if limit is not None and len(kept) >= limit:
            break
        original = originals.repeated(hit)
        if original is None:
            kept.append(hit)
            sources[hit.chunk.chunk_id] = {hit.chunk.doc_id}
            continue
        docs = sources[original.chunk.chunk_id]
        if hit.chunk.doc_id not in docs:
            docs.add(hit.chunk.doc_id)
            kept.append(hit)
            duplicate_of[hit.chunk.chunk_id] = original.chunk.chunk_id
    return kept, duplicate_of


class _Originals:
    """The passages kept as originals so far and their shingle sets; ``repeated(hit)`` is
    the first of them that ``hit`` nearly repeats, or ``None`` (then ``hit`` joins them)."""

    def __init__(
        self, shingles_of: Callable[[SearchHit], AbstractSet[Hashable]], threshold: float
    ) -> None:
        self.shingles_of = shingles_of
        self.threshold = threshold
        self.hits: list[SearchHit] = []
        self.sets: list[AbstractSet[Hashable]] = []

    def repeated(self, hit: SearchHit) -> SearchHit | None:
        current = self.shingles_of(hit)
        size = len(current)
        threshold = self.threshold
        for original, other in zip(self.hits, self.sets, strict=True):
            if not size or not other:
                continue
            # |A ∩ B| / |A ∪ B| ≤ min / max: sets of too different sizes cannot reach the
            # threshold, so most pairs need no intersection (exact, not a heuristic).
            if size <= len(other):
                small, large = current, other
            else:
                small, large = other, current
            if len(small) < threshold * len(large):
                continue
            if _near(small, large, threshold):
                return original
        self.hits.append(hit)
        self.sets.append(current)
        return None


def _near(small: AbstractSet[Hashable], large: AbstractSet[Hashable], threshold: float) -> bool:
    """Whether ``|small ∩ large| / |small ∪ large| >= threshold``, read from the smaller set
    until enough of it is missing from the larger that the rest could not reach the threshold
    (unrelated passages: after about a tenth of it at 0.8, instead of a whole intersection).
    Exact: the same answer as computing the intersection."""
    total = len(small) + len(large)
    # The fewest shared elements that reach the threshold: c / (total − c) ≥ t.
    # From the real-number answer, then stepped to the comparison's own float answer.
    need = max(0, math.ceil(threshold * total / (1 + threshold)))
    while need > 0 and (need - 1) / (total - need + 1) >= threshold:
        need -= 1
    while need <= len(small) and need / (total - need) < threshold:
        need += 1
    if need > len(small):
        return False
    allowed = len(small) - need  # elements of ``small`` that may be missing from ``large``
    missing = 0
    for item in small:
        if item not in large:
            missing += 1
            if missing > allowed:
                return False
    return True


def within_budget(
    hits: Iterable[SearchHit],
    text_of: Callable[[SearchHit], str],
    count_tokens: Callable[[str], int],
    max_tokens: int,
) -> list[SearchHit]:
    """The best-ranked hits whose texts together fit ``max_tokens`` (stops at the first
    that does not fit, so the order of relevance is kept)."""
    out: list[SearchHit] = []
    used = 0
    for hit in hits:
        cost = count_tokens(text_of(hit))
        if used + cost > max_tokens:
            break
        out.append(hit)
        used += cost
    return out
