"""best_snippet: the sentence window with the most query terms, within max_chars."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.search.snippets import best_snippet, terms

FILLER = [
    "The weather in the valley was mild all week.",
    "Volunteers repainted the community hall on Saturday.",
    "The library extended its opening hours in winter.",
    "A new bus route connects the two villages.",
    "Local farmers sold apples at the Sunday market.",
    "The choir rehearsed twice before the concert.",
]
TARGET = "Our team uses Milvus for hybrid vector search over project documents."


def body_with_target(position: int) -> str:
    sentences = FILLER * 3
    sentences.insert(position, TARGET)
    return " ".join(sentences)


def test_short_body_is_returned_whole_and_stripped():
    assert best_snippet("  short text.  ", "anything", 100) == "short text."


@pytest.mark.parametrize("position", [0, 7, 18])
def test_picks_window_containing_query_terms(position):
    snippet = best_snippet(body_with_target(position), "milvus hybrid search", 160)
    assert TARGET in snippet
    assert len(snippet) <= 160


def test_query_terms_are_matched_case_insensitively():
    snippet = best_snippet(body_with_target(9), "MILVUS VECTOR", 120)
    assert "Milvus" in snippet


def test_window_with_more_query_terms_wins():
    body = " ".join(
        FILLER[:3]
        + ["Milvus is mentioned once here."]
        + FILLER[3:]
        + ["Milvus hybrid search with vector ranking."]
        + FILLER
    )
    snippet = best_snippet(body, "milvus hybrid vector ranking", 60)
    assert snippet == "Milvus hybrid search with vector ranking."


def test_ukrainian_query_terms_are_found():
    target = "Проєкти команди використовують Milvus для пошуку."
    body = " ".join(FILLER * 2 + [target] + FILLER)
    snippet = best_snippet(body, "які проєкти використовують Milvus?", 120)
    assert "Проєкти команди використовують Milvus" in snippet


@pytest.mark.parametrize("max_chars", [40, 41, 60, 100, 200, 320])
def test_snippet_never_exceeds_max_chars(max_chars):
    body = body_with_target(5) + " " + "x" * 500 + " " + ("averyveryverylongword " * 30)
    for query in ["milvus", "nothing matches", "averyveryverylongword", ""]:
        assert len(best_snippet(body, query, max_chars)) <= max_chars


def test_sentence_longer_than_max_chars_is_cut_at_a_word_with_ellipsis():
    long_sentence = " ".join(f"word{i}" for i in range(100)) + "."
    snippet = best_snippet(long_sentence, "word5", 50)
    assert snippet.endswith("…")
    assert len(snippet) <= 50
    assert long_sentence.startswith(snippet[:-1])


def test_no_matching_terms_gives_the_first_window():
    snippet = best_snippet(body_with_target(10), "zebra", 100)
    assert snippet.startswith(FILLER[0])


def test_newlines_separate_sentences():
    body = "\n".join(FILLER * 2) + "\nMilvus line without a full stop\n" + "\n".join(FILLER)
    assert "Milvus line without a full stop" in best_snippet(body, "milvus", 80)


def test_terms_ignore_words_of_two_letters_or_less():
    assert terms("Is it AI or Milvus?") == {"milvus"}


def reference_snippet(body: str, query: str, max_chars: int) -> str:
    """The window search as first written: every window built as a string, step by step."""
    import re

    from serve_app.search.snippets import sentences

    body = body.strip()
    if len(body) <= max_chars:
        return body
    wanted = terms(query)
    parts = sentences(body)
    hits_of = [len(wanted & set(re.findall(r"\w+", s.lower()))) for s in parts]
    best, best_hits = "", -1
    for start in range(len(parts)):
        window, hits = "", 0
        for i in range(start, len(parts)):
            candidate = f"{window} {parts[i]}".strip()
            if len(candidate) > max_chars and window:
                break
            window = candidate
            hits += hits_of[i]
        if hits > best_hits:
            best, best_hits = window, hits
    if len(best) > max_chars:
        best = best[: max_chars - 1].rsplit(" ", 1)[0] + "…"
    return best


_PIECES = st.sampled_from(
    [
        "Milvus stores vectors.",
        "hybrid search!",
        "  Neo4j holds the graph?  ",
        "a…",
        "\n\n",
        "   ",
        "Straße İstanbul naïve.",
        "x" * 90 + ".",
        "tabs\tand\u00a0spaces.",
        "word",
        "\t",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_PIECES, max_size=14).map(" ".join),
    st.sampled_from(["milvus hybrid search", "graph neo4j", "", "the", "straße naïve"]),
    st.integers(min_value=40, max_value=200),
)
def test_window_search_equals_building_every_window(body: str, query: str, max_chars: int):
    assert best_snippet(body, query, max_chars) == reference_snippet(body, query, max_chars)
