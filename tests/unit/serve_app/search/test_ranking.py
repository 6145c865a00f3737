"""Fusion, near-duplicate removal and token budget of the query pipeline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.protocols import ChunkRecord, SearchHit
from serve_app.search.ranking import (
    THEORETICAL_MIN,
    _near,
    adaptive_weights,
    collapse_near_duplicates,
    drop_near_duplicates,
    fuse_rrf,
    fuse_weighted,
    list_confidence,
    shingles,
    within_budget,
)


def hit(cid: str, score: float, text: str = "", doc: str = "") -> SearchHit:
    chunk = ChunkRecord(
        chunk_id=cid,
        doc_id=doc or cid,
        team_id="t",
        chunk_index=0,
        text=text or f"text of {cid}",
        title="",
        content_hash="",
        embed_model="m",
    )
    return SearchHit(chunk=chunk, score=score, scores={})


def ids(hits: list[SearchHit]) -> list[str]:
    return [h.chunk.chunk_id for h in hits]


def test_rrf_rewards_agreement_between_methods():
    lists = {
        "dense": [hit("a", 0.9), hit("b", 0.8), hit("e", 0.7)],
        "bm25": [hit("c", 12.0), hit("b", 11.0), hit("d", 3.0)],
    }
    fused = fuse_rrf(lists, k=60)
    assert ids(fused)[0] == "b"  # ranked 2nd by both beats 1st by one
    assert fused[0].scores == {"dense": 0.8, "bm25": 11.0, "rrf": pytest.approx(2 / 62)}
    assert set(ids(fused)) == {"a", "b", "c", "d", "e"}


def test_rrf_weights_can_silence_a_method():
    lists = {"dense": [hit("a", 0.9)], "bm25": [hit("b", 5.0)]}
    assert ids(fuse_rrf(lists, weights={"dense": 0.0, "bm25": 1.0}))[0] == "b"


def test_weighted_fusion_normalises_each_method_scale():
    # BM25 scores are an order of magnitude larger; normalisation keeps them comparable.
    lists = {"dense": [hit("a", 0.90), hit("b", 0.10)], "bm25": [hit("b", 30.0), hit("a", 10.0)]}
    fused = fuse_weighted(lists, {"dense": 0.7, "bm25": 0.3})
    assert ids(fused) == ["a", "b"]
    assert fused[0].score == pytest.approx(0.7)
    assert fused[1].score == pytest.approx(0.3)


def test_weighted_fusion_of_single_hit_lists_is_defined():
    fused = fuse_weighted({"dense": [hit("a", 0.5)], "bm25": []}, {"dense": 1.0, "bm25": 1.0})
    assert ids(fused) == ["a"] and fused[0].score == 1.0


def test_theoretical_normalisation_lets_the_confident_method_decide():
    # Dense is unsure (cosines 0.41 vs 0.40), BM25 is sure (20 vs 2). Min-max stretches the
    # dense gap to 0..1 and it outvotes BM25; theoretical bounds keep it small.
    lists = {"dense": [hit("a", 0.41), hit("b", 0.40)], "bm25": [hit("b", 20.0), hit("a", 2.0)]}
    weights = {"dense": 0.6, "bm25": 0.4}
    assert ids(fuse_weighted(lists, weights, "minmax")) == ["a", "b"]
    fused = fuse_weighted(lists, weights, "theoretical")
    assert ids(fused) == ["b", "a"]
    # b: 0.6 * (0.40 + 1) / (0.41 + 1) + 0.4 * 20 / 20
    assert fused[0].score == pytest.approx(0.6 * 1.40 / 1.41 + 0.4)


def test_unknown_normalisation_is_refused():
    with pytest.raises(ValueError, match="normalisation"):
        fuse_weighted({"dense": [hit("a", 1.0)]}, {"dense": 1.0}, "zscore")


def test_near_duplicates_keep_the_best_ranked_copy():
    base = "the solar farm in district four feeds the community microgrid every afternoon"
    hits = [hit("a", 3, base), hit("b", 2, base + " today"), hit("c", 1, "an unrelated note")]
    kept = drop_near_duplicates(hits, lambda h: shingles(h.chunk.text), threshold=0.8)
    assert ids(kept) == ["a", "c"]


def test_distinct_passages_are_all_kept():
    hits = [hit(str(i), 1, f"passage number {i} about topic {i * 7}") for i in range(5)]
    assert len(drop_near_duplicates(hits, lambda h: shingles(h.chunk.text), 0.8)) == 5


def test_shingles_of_short_text():
    assert shingles("one two") == {("one", "two")}
    assert shingles("") == set()


def test_budget_stops_at_first_passage_that_does_not_fit():
    hits = [hit("a", 3, "w " * 5), hit("b", 2, "w " * 10), hit("c", 1, "w " * 2)]
    count = lambda text: len(text.split())  # noqa: E731
    assert ids(within_budget(hits, lambda h: h.chunk.text, count, 12)) == ["a"]
    assert ids(within_budget(hits, lambda h: h.chunk.text, count, 17)) == ["a", "b", "c"]


def test_near_duplicate_removal_stops_at_the_limit_and_still_skips_copies():
    base = "the solar farm in district four feeds the community microgrid every afternoon"
    hits = [hit("a", 4, base), hit("b", 3, base), hit("c", 2, "another note entirely here")]
    hits.append(hit("d", 1, "a fourth unrelated passage about rivers"))
    assert ids(drop_near_duplicates(hits, lambda h: shingles(h.chunk.text), 0.8, limit=2)) == [
        "a",
        "c",
    ]
    assert ids(drop_near_duplicates(hits, lambda h: shingles(h.chunk.text), 0.8, limit=None)) == [
        "a",
        "c",
        "d",
    ]


def test_list_confidence_tells_a_clear_winner_from_a_flat_list():
    peaked = [hit("a", 9.0)] + [hit(f"x{i}", 1.0 + i * 0.01) for i in range(20)]
    # Ten candidates the method cannot tell apart above a tail.
    flat = [hit(f"y{i}", 0.50 - i * 0.0001) for i in range(10)]
    flat += [hit(f"z{i}", 0.30 - i * 0.01) for i in range(10)]
    assert list_confidence(peaked) > 0.9
    assert list_confidence(flat) < 0.2
    assert list_confidence(peaked, measure="margin") > 0.9
    assert list_confidence([hit("a", 1.0)]) == 1.0
    assert list_confidence([hit("a", 1.0), hit("b", 1.0)]) == 0.0
    # Negative scores (Milvus Lite's BM25) normalise the same way.
    assert list_confidence([hit("a", -1.0), hit("b", -9.0), hit("c", -9.5)]) > 0.9


def test_adaptive_weights_shift_towards_the_confident_method():
    peaked = [hit("a", 9.0)] + [hit(f"x{i}", 1.0 + i * 0.01) for i in range(20)]
    # Ten candidates the method cannot tell apart above a tail.
    flat = [hit(f"y{i}", 0.50 - i * 0.0001) for i in range(10)]
    flat += [hit(f"z{i}", 0.30 - i * 0.01) for i in range(10)]
    base = {"dense": 0.5, "bm25": 0.5}
    w = adaptive_weights({"dense": flat, "bm25": peaked}, base)
    assert w["bm25"] > 0.8 and abs(sum(w.values()) - 1.0) < 1e-9
    w = adaptive_weights({"dense": peaked, "bm25": flat}, base)
    assert w["dense"] > 0.8
    assert adaptive_weights({"dense": flat, "bm25": peaked}, base, gamma=0) == base
    # A method without candidates keeps its base weight; all-flat lists keep the base.
    assert adaptive_weights({"dense": [], "bm25": peaked}, base)["dense"] > 0
    same = [hit("z", 1.0), hit("w", 1.0)]
    assert adaptive_weights({"dense": same, "bm25": same}, base) == base


def test_relgap_confidence_is_the_relative_drop_to_the_kth_score():
    hits = [hit(f"c{i}", s) for i, s in enumerate([0.8, 0.7, 0.6, 0.4])]
    assert list_confidence(hits, k=4, measure="relgap") == pytest.approx(0.5)
    assert list_confidence(hits, k=2, measure="relgap") == pytest.approx(0.125)
    # Clipped to 0..1; a zero top score says nothing.
    assert list_confidence([hit("a", 1.0), hit("b", -3.0)], measure="relgap") == 1.0
    assert list_confidence([hit("a", 0.0), hit("b", 0.0)], measure="relgap") == 0.0


def test_collapse_keeps_another_documents_copy_as_a_duplicate_and_drops_a_repeated_source():
    base = "the solar farm in district four feeds the community microgrid every afternoon"
    hits = [
        hit("a1", 5, base, doc="A"),
        hit("a2", 4, base + " today", doc="A"),  # the same document again: nothing new
        hit("b1", 3, base, doc="B"),  # another document holding the text: cited
        hit("b2", 2, base, doc="B"),  # B is already cited for it
        hit("c1", 1, "an unrelated note about rivers and bridges", doc="C"),
    ]
    kept, duplicate_of = collapse_near_duplicates(hits, lambda h: shingles(h.chunk.text), 0.8)
    assert ids(kept) == ["a1", "b1", "c1"]
    assert duplicate_of == {"b1": "a1"}


def test_collapse_counts_duplicates_towards_the_limit():
    base = "the solar farm in district four feeds the community microgrid every afternoon"
    hits = [hit("a", 3, base), hit("b", 2, base), hit("c", 1, "another note entirely here")]
    kept, duplicate_of = collapse_near_duplicates(
        hits, lambda h: shingles(h.chunk.text), 0.8, limit=2
    )
    assert ids(kept) == ["a", "b"] and duplicate_of == {"b": "a"}


@settings(max_examples=400, deadline=None)
@given(
    sets=st.deferred(lambda: EDITED_SETS),
    docs=st.lists(st.sampled_from("ABC"), min_size=30, max_size=30),
    threshold=st.sampled_from([0.5, 0.8, 1.0]),
)
def test_collapse_keeps_the_originals_drop_keeps_and_cites_each_source_once(sets, docs, threshold):
    hits = [hit(str(i), 1.0, doc=docs[i]) for i in range(len(sets))]
    by_id = {str(i): s for i, s in enumerate(sets)}

    def shingles_of(h: SearchHit) -> set[int]:
        return by_id[h.chunk.chunk_id]

    kept, duplicate_of = collapse_near_duplicates(hits, shingles_of, threshold)
    originals = [h for h in kept if h.chunk.chunk_id not in duplicate_of]
    assert ids(originals) == ids(drop_near_duplicates(hits, shingles_of, threshold))
    position = {h.chunk.chunk_id: n for n, h in enumerate(kept)}
    doc_of = {h.chunk.chunk_id: h.chunk.doc_id for h in hits}
    cited: dict[str, set[str]] = {h.chunk.chunk_id: {h.chunk.doc_id} for h in originals}
    for copy, original in duplicate_of.items():
        assert original in cited and position[original] < position[copy]
        a, b = by_id[copy], by_id[original]
        assert a and b and len(a & b) / len(a | b) >= threshold
        assert doc_of[copy] not in cited[original]  # a new source of the text, once
        cited[original].add(doc_of[copy])


def _near_duplicates_pair_by_pair(sets: list[set[int]], threshold: float) -> list[int]:
    kept: list[int] = []
    for i, current in enumerate(sets):
        if not any(
            current and sets[k] and len(current & sets[k]) / len(current | sets[k]) >= threshold
            for k in kept
        ):
            kept.append(i)
    return kept


# Sets made from a few bases with small edits: many pairs are near each other, in both
# orders of size.
EDITED_SETS = st.lists(st.sets(st.integers(0, 40), max_size=25), min_size=1, max_size=3).flatmap(
    lambda bases: st.lists(
        st.tuples(
            st.sampled_from(bases),
            st.sets(st.integers(0, 40), max_size=4),
            st.sets(st.integers(0, 40), max_size=4),
        ).map(lambda t: (t[0] | t[1]) - t[2]),
        max_size=30,
    )
)


@settings(max_examples=800, deadline=None)
@given(
    sets=EDITED_SETS,
    threshold=st.one_of(
        st.sampled_from([0.5, 0.6, 0.75, 0.8, 0.9, 1.0]), st.floats(0.01, 1.0), st.just(0.0)
    ),
    limit=st.one_of(st.none(), st.integers(1, 30)),
)
def test_near_duplicates_keep_what_every_pair_compared_in_full_keeps(sets, threshold, limit):
    """The size bound (pairs of too different sizes are not intersected) keeps exactly what
    comparing every pair keeps: any threshold, with or without a limit."""
    hits = [hit(str(i), 1.0) for i in range(len(sets))]
    by_id = {str(i): s for i, s in enumerate(sets)}
    kept = drop_near_duplicates(hits, lambda h: by_id[h.chunk.chunk_id], threshold, limit=limit)
    expected = _near_duplicates_pair_by_pair(sets, threshold)
    assert [int(h.chunk.chunk_id) for h in kept] == expected[:limit]


def _fused_eagerly(
    lists: dict[str, list[SearchHit]], contribution: dict[str, list[float]], name: str
) -> list[tuple[str, float, dict[str, float], int]]:
    """Fusion as the pipeline made it before hits were made lazily: every hit at once, the
    chunk of the first list that found it, ordered by (-score, chunk id)."""
    fused: dict[str, float] = {}
    first: dict[str, ChunkRecord] = {}
    per_method: dict[str, dict[str, float]] = {}
    for method, hits in lists.items():
        for hit_, part in zip(hits, contribution[method], strict=True):
            cid = hit_.chunk.chunk_id
            first.setdefault(cid, hit_.chunk)
            fused[cid] = fused.get(cid, 0.0) + part
            per_method.setdefault(cid, {})[method] = hit_.score
    order = sorted(fused, key=lambda cid: (-fused[cid], cid))
    return [(c, fused[c], {**per_method[c], name: fused[c]}, id(first[c])) for c in order]


def _shape(hits) -> list[tuple[str, float, dict[str, float], int]]:
    return [(h.chunk.chunk_id, h.score, h.scores, id(h.chunk)) for h in hits]


# Lists of hits over a few chunk ids: repeats across methods and within one, ties of score.
METHOD_LISTS = st.dictionaries(
    st.sampled_from(["dense", "bm25", "lexical"]),
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0])),
        max_size=8,
    ),
    min_size=1,
)


@settings(max_examples=300, deadline=None)
@given(raw=METHOD_LISTS, k=st.integers(1, 80))
def test_rrf_made_lazily_is_the_eager_fusion(raw, k):
    lists = {m: [hit(c, s) for c, s in found] for m, found in raw.items()}
    weights = {"dense": 0.7, "bm25": 0.3}
    parts = {
        m: [weights.get(m, 0.0) / (k + r) for r in range(1, len(h) + 1)] for m, h in lists.items()
    }
    assert _shape(fuse_rrf(lists, k, weights)) == _fused_eagerly(lists, parts, "rrf")


@settings(max_examples=300, deadline=None)
@given(raw=METHOD_LISTS, normalisation=st.sampled_from(["minmax", "theoretical"]))
def test_weighted_fusion_made_lazily_is_the_eager_fusion(raw, normalisation):
    lists = {m: [hit(c, s) for c, s in found] for m, found in raw.items()}
    weights = {"dense": 0.6, "bm25": 0.3, "lexical": 0.1}
    parts = {}
    for method, hits in lists.items():
        scores = [h.score for h in hits]
        high = max(scores, default=0.0)
        low = (
            min(scores, default=0.0)
            if normalisation == "minmax"
            else min(THEORETICAL_MIN.get(method, 0.0), high)
        )
        span = high - low
        parts[method] = [weights[method] * ((s - low) / span if span > 0 else 1.0) for s in scores]
    fused = fuse_weighted(lists, weights, normalisation)
    eager = _fused_eagerly({m: h for m, h in lists.items() if h}, parts, "weighted")
    assert _shape(fused) == eager
    assert len(fused) == len(eager) and bool(fused) == bool(eager)


def test_fused_hits_are_made_only_as_far_as_they_are_read():
    lists = {
        "dense": [hit(c, 1.0 - i / 10) for i, c in enumerate("abcdef")],
        "bm25": [hit(c, 6.0 - i) for i, c in enumerate("fedcba")],
    }
    fused = fuse_weighted(lists, {"dense": 0.7, "bm25": 0.3})
    assert len(fused) == 6 and fused._made == []
    first_two = [h for _, h in zip(range(2), fused, strict=False)]
    assert len(fused._made) == 2
    # Read again, or by position: the same objects, nothing made twice.
    assert fused[1] is first_two[1] and fused[-6] is first_two[0]
    assert fused[5].chunk.chunk_id == ids(fused)[-1] and len(fused._made) == 6
    assert [h.chunk.chunk_id for h in fused[1:3]] == ids(fused)[1:3]
    with pytest.raises(IndexError):
        fused[6]


@settings(max_examples=1500, deadline=None)
@given(
    pair=EDITED_SETS.filter(lambda s: len(s) >= 2).map(lambda s: (s[0], s[1])),
    threshold=st.one_of(
        st.sampled_from([0.0, 0.5, 0.8, 0.9, 1.0, 0.1 + 0.2, 2 / 3]), st.floats(0.0, 1.0)
    ),
)
def test_reading_the_smaller_set_until_too_much_is_missing_is_the_full_jaccard(pair, threshold):
    """``_near`` stops reading once the rest of the smaller set could not reach the
    threshold: the same verdict as the whole intersection, for every threshold."""
    a, b = pair
    if not a or not b:
        return
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    common = len(a & b)
    assert _near(small, large, threshold) == (common / (len(a) + len(b) - common) >= threshold)
