"""PassageMemo: what it remembers of a passage gives the answers derived afresh would give
(near-duplicates, snippets), only for the text it was made from, within its capacity."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from batch_ingest.chunks import compose_text, strip_header
from deployments.protocols import ChunkRecord, SearchHit
from serve_app.search.passages import PassageMemo
from serve_app.search.ranking import drop_near_duplicates, shingles
from serve_app.search.snippets import best_snippet, terms

VOCAB = ["milvus", "graph", "team", "vector", "search", "the", "a", "of", "é", "Київ", "data"]
SENTENCE = st.lists(st.sampled_from(VOCAB), min_size=0, max_size=9).map(" ".join)
ENDS = st.sampled_from([". ", "! ", "? ", "\n", "\n\n", " ", "… "])
BODY = st.lists(st.tuples(SENTENCE, ENDS), max_size=12).map(
    lambda parts: "".join(s + e for s, e in parts)
)


def chunk(cid: str, body: str, title: str = "Doc", heading: str = "") -> ChunkRecord:
    return ChunkRecord(
        chunk_id=cid,
        doc_id="d",
        team_id="t",
        chunk_index=0,
        text=compose_text(title, heading, body),
        title=title,
        heading=heading,
        content_hash="h",
        embed_model="m@1",
    )


@settings(max_examples=300, deadline=None)
@given(body=BODY, query=SENTENCE, max_chars=st.integers(40, 200))
def test_a_remembered_snippet_is_the_one_derived_afresh(body, query, max_chars):
    memo = PassageMemo(8)
    c = chunk("c", body)
    expected = best_snippet(strip_header(c), query, max_chars)
    assert memo.of(c).snippet(terms(query), max_chars) == expected
    # The second use reads the remembered sentences.
    assert memo.of(c).snippet(terms(query), max_chars) == expected
    assert memo.hits == 1


@settings(max_examples=200, deadline=None)
@given(bodies=st.lists(BODY, min_size=1, max_size=8), threshold=st.floats(0.3, 1.0))
def test_near_duplicates_on_remembered_shingles_keep_the_same_passages(bodies, threshold):
    # Copies and near copies among them, so some pairs are duplicates.
    bodies = bodies + [b + " data" for b in bodies[:2]] + bodies[:1]
    hits = [SearchHit(chunk=chunk(str(i), b), score=1.0) for i, b in enumerate(bodies)]
    memo = PassageMemo(4)  # smaller than the list: entries are evicted while it runs
    fresh = drop_near_duplicates(hits, lambda h: shingles(strip_header(h.chunk)), threshold)
    remembered = drop_near_duplicates(hits, memo.shingles, threshold)
    assert [h.chunk.chunk_id for h in remembered] == [h.chunk.chunk_id for h in fresh]


def test_a_chunk_with_another_text_under_the_same_id_is_derived_again():
    memo = PassageMemo(8)
    old = chunk("c", "Milvus stores the vectors. " * 30)
    new = replace(old, text=compose_text("Doc", "", "Neo4j holds the graph. " * 30))
    assert "Milvus" in memo.of(old).snippet({"milvus"}, 80)
    assert "Neo4j" in memo.of(new).snippet({"neo4j"}, 80)
    assert memo.misses == 2 and memo.hits == 0
    assert memo.of(new).body == strip_header(new)


def test_the_memo_keeps_the_most_recently_used_passages_within_its_capacity():
    memo = PassageMemo(2)
    a, b, c = (chunk(x, f"passage {x} " * 5) for x in "abc")
    memo.of(a), memo.of(b), memo.of(a), memo.of(c)  # b is the least recently used
    assert len(memo) == 2
    memo.of(a)
    assert memo.hits == 2
    memo.of(b)
    assert memo.misses == 4  # b was evicted


@settings(max_examples=100, deadline=None)
@given(body=BODY, query=SENTENCE)
def test_a_snippet_without_the_memo_is_the_same(body, query):
    c = chunk("c", body)
    assert PassageMemo(0).of(c).snippet(terms(query), 60) == best_snippet(
        strip_header(c), query, 60
    )


def test_capacity_zero_remembers_nothing():
    memo = PassageMemo(0)
    c = chunk("c", "one two three four five six")
    assert memo.of(c).shingles == memo.of(c).shingles
    assert len(memo) == 0 and memo.hits == 0
