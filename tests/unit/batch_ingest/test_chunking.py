"""Structure-aware chunking, measured with the embedder's real tokenizer."""

from __future__ import annotations

import pytest

from batch_ingest.chunking import Chunker, TokenCounter, tokenizer_counter, whitespace_tokens
from deployments.models.embedding import default_model_path

SENTENCES = [
    "Milvus stores the dense vectors of every chunk.",
    "Neo4j keeps the graph of projects, channels and agents.",
    "The gateway filters every search by team and visibility.",
    "Ray Serve batches concurrent embedding requests together.",
    "Idempotent ingestion means re-sending a document changes nothing.",
    "Hybrid search fuses BM25 and vector rankings with RRF.",
    "Snippets show the part of a chunk that matches the query.",
    "Confidential documents are hidden from public callers.",
]

UKRAINIAN = (
    "# Проєкти\n\n"
    "Наша команда використовує Milvus для пошуку документів. "
    "Графова база Neo4j зберігає звʼязки між проєктами, каналами та агентами. "
    "Кожен запит фільтрується за командою та рівнем доступу.\n\n"
    "## Зелена їжа\n\n"
    "Проєкт «Зелена їжа» відстежує партії продуктів від ферми до столу. "
    "Агенти відповідають на питання учасників українською мовою."
)


@pytest.fixture(scope="module")
def count() -> TokenCounter:
    return tokenizer_counter(default_model_path())


def long_paragraph(n: int) -> str:
    """``n`` distinct sentences in one paragraph (no blank line)."""
    return " ".join(f"Note {i}: {SENTENCES[i % len(SENTENCES)]}" for i in range(n))


def test_tokenizer_counter_uses_the_model_wordpiece_tokenizer(count):
    assert count("hello world") == 2
    # WordPiece splits a rare word into several pieces; words only count one.
    assert count("tokenization") > whitespace_tokens("tokenization")


def test_tokenizer_counter_falls_back_to_word_count_without_tokenizer_json(tmp_path):
    assert tokenizer_counter(str(tmp_path)) is whitespace_tokens


def test_headings_produce_heading_paths(count):
    text = "# A\n\npara a\n\n## B\n\npara b\n\n### C\n\npara c\n\n# D\n\npara d"
    chunks = Chunker(count, 64, 8).split(text)
    assert [(c.heading, c.text) for c in chunks] == [
        ("A", "para a"),
        ("A › B", "para b"),
        ("A › B › C", "para c"),
        ("D", "para d"),
    ]


def test_sibling_heading_replaces_previous_sibling_in_path(count):
    text = "# Guide\n\n## Install\n\nrun pip\n\n## Configure\n\nset env"
    headings = [c.heading for c in Chunker(count, 64, 8).split(text)]
    assert headings == ["Guide › Install", "Guide › Configure"]


def test_text_before_first_heading_has_empty_heading_path(count):
    chunks = Chunker(count, 64, 8).split("preamble line\n\n# Title\n\nbody")
    assert [(c.heading, c.text) for c in chunks] == [("", "preamble line"), ("Title", "body")]


def test_heading_closing_hashes_are_not_part_of_the_heading(count):
    chunks = Chunker(count, 64, 8).split("## Setup ##\n\nbody")
    assert chunks[0].heading == "Setup"


def test_hashtag_without_space_is_not_a_heading(count):
    chunks = Chunker(count, 64, 8).split("#milvus is great\n\nmore text")
    assert [c.heading for c in chunks] == [""]
    assert chunks[0].text.startswith("#milvus is great")


def test_paragraphs_kept_whole_when_they_fit(count):
    paragraphs = [SENTENCES[0], SENTENCES[1] + " " + SENTENCES[2], SENTENCES[3]]
    chunks = Chunker(count, 200, 20).split("\n\n".join(paragraphs))
    assert len(chunks) == 1
    assert chunks[0].text == "\n\n".join(paragraphs)


def test_paragraphs_that_fit_alone_are_never_cut(count):
    paragraphs = [long_paragraph(3), long_paragraph(2), long_paragraph(3), long_paragraph(1)]
    budget = max(count(p) for p in paragraphs)
    chunks = Chunker(count, budget, 0).split("\n\n".join(paragraphs))
    pieces = [piece for c in chunks for piece in c.text.split("\n\n")]
    assert pieces == paragraphs


@pytest.mark.parametrize(("max_tokens", "overlap"), [(16, 0), (16, 8), (40, 10), (120, 30)])
def test_no_chunk_over_max_tokens(count, max_tokens, overlap):
    text = "\n\n".join(
        [
            "# Overview",
            long_paragraph(12),
            "## Details",
            SENTENCES[0],
            # One sentence without any sentence break, longer than every budget.
            " ".join(["unpunctuated words keep flowing"] * 60),
            long_paragraph(5),
        ]
    )
    chunks = Chunker(count, max_tokens, overlap).split(text)
    assert len(chunks) > 1
    assert all(count(c.text) <= max_tokens for c in chunks)


def test_no_words_are_lost_when_a_paragraph_is_split(count):
    text = long_paragraph(20)
    chunks = Chunker(count, 40, 0).split(text)
    assert len(chunks) > 1
    assert " ".join(c.text for c in chunks).split() == text.split()


def shared_words(previous: str, current: str) -> list[str]:
    """The longest run of whole words that ends ``previous`` and starts ``current``."""
    before, after = previous.split(), current.split()
    for k in range(min(len(before), len(after)), 0, -1):
        if before[-k:] == after[:k]:
            return after[:k]
    return []


def test_overlap_carries_tail_of_previous_chunk_into_next(count):
    # Paragraphs of one sentence each: the section is split between paragraphs.
    text = "\n\n".join(SENTENCES * 2)
    chunks = Chunker(count, 40, 10).split(text)
    assert len(chunks) > 2
    for previous, current in zip(chunks, chunks[1:], strict=False):
        carried = shared_words(previous.text, current.text)
        assert carried, (previous.text, current.text)
        assert count(" ".join(carried)) <= 10


def test_zero_overlap_carries_nothing(count):
    chunks = Chunker(count, 40, 0).split(long_paragraph(16))
    words = [w for c in chunks for w in c.text.split()]
    assert words == long_paragraph(16).split()


def test_overlap_not_carried_across_sections(count):
    text = "# One\n\n" + long_paragraph(8) + "\n\n# Two\n\nshort body of section two"
    chunks = Chunker(count, 40, 10).split(text)
    assert chunks[-1].heading == "Two"
    assert chunks[-1].text == "short body of section two"


def test_chunk_indexes_are_consecutive_across_sections(count):
    text = "# One\n\n" + long_paragraph(8) + "\n\n# Two\n\n" + long_paragraph(8)
    chunks = Chunker(count, 40, 5).split(text)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert {c.heading for c in chunks} == {"One", "Two"}


def test_code_fence_comments_are_not_headings(count):
    text = "# Setup\n\nInstall it:\n\n```python\n# not a heading\nimport milvus\n```\n\nDone."
    chunks = Chunker(count, 200, 0).split(text)
    assert {c.heading for c in chunks} == {"Setup"}
    assert "# not a heading" in chunks[0].text


def test_blank_lines_inside_code_fence_keep_the_block_together(count):
    code = "```\n# first\n\n# second\n```"
    chunks = Chunker(count, 200, 0).split("# Code\n\n" + code + "\n\nafter")
    assert chunks[0].text == code + "\n\nafter"
    assert chunks[0].heading == "Code"


def test_heading_after_closed_code_fence_is_a_heading_again(count):
    text = "```\n# inside\n```\n\n# Outside\n\nbody"
    chunks = Chunker(count, 200, 0).split(text)
    assert [(c.heading, c.text) for c in chunks] == [
        ("", "```\n# inside\n```"),
        ("Outside", "body"),
    ]


def test_ukrainian_text_keeps_cyrillic_headings_and_words(count):
    chunks = Chunker(count, 40, 8).split(UKRAINIAN)
    assert {c.heading for c in chunks} == {"Проєкти", "Проєкти › Зелена їжа"}
    assert all(count(c.text) <= 40 for c in chunks)
    body_words = set(UKRAINIAN.split()) - {"#", "##", "Проєкти", "Зелена", "їжа"}
    chunk_words = {w for c in chunks for w in c.text.split()}
    assert body_words <= chunk_words


@pytest.mark.parametrize("text", ["", " ", "\n\n\n", " \t \r\n \n"])
def test_empty_or_whitespace_text_gives_no_chunks(count, text):
    assert Chunker(count, 40, 5).split(text) == []


def test_heading_only_text_is_kept_as_one_chunk(count):
    chunks = Chunker(count, 40, 5).split("# Only a title\n\n## And a subtitle\n")
    assert [c.text for c in chunks] == ["# Only a title\n\n## And a subtitle"]


def test_windows_line_endings_split_like_unix_ones(count):
    unix = "# A\n\npara one\n\npara two"
    chunker = Chunker(count, 40, 5)
    assert chunker.split(unix.replace("\n", "\r\n")) == chunker.split(unix)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(10, 10), (10, 11)])
def test_overlap_not_below_max_tokens_rejected(max_tokens, overlap):
    with pytest.raises(ValueError, match="overlap_tokens"):
        Chunker(whitespace_tokens, max_tokens, overlap)


def test_sibling_headings_after_skipped_level_are_not_nested(count):
    text = "# A\n\n### C\n\ntext c\n\n### C2\n\ntext c2"
    headings = [c.heading for c in Chunker(count, 64, 8).split(text)]
    assert headings == ["A › C", "A › C2"]


def test_heading_ending_in_hash_glued_to_word_keeps_it(count):
    chunks = Chunker(count, 64, 8).split("## Using C#\n\nbody")
    assert chunks[0].heading == "Using C#"


def test_overlap_carried_when_one_long_paragraph_is_split(count):
    chunks = Chunker(count, 200, 30).split(long_paragraph(80))
    assert len(chunks) > 2
    for previous, current in zip(chunks, chunks[1:], strict=False):
        assert shared_words(previous.text, current.text)


def test_unbreakable_token_run_is_still_cut_to_max_tokens(count):
    url = "https://example.org/search?" + "&".join(f"k{i}=v{i}" for i in range(30))
    chunks = Chunker(count, 32, 4).split(f"see {url} for details")
    assert all(count(c.text) <= 32 for c in chunks)
