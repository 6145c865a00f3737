"""``deployments.text.words``: exactly the lower-cased ``\\w+`` runs, on either path."""

from __future__ import annotations

import re
import string

from hypothesis import given
from hypothesis import strategies as st

from deployments.text import words


def reference(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def test_ascii_passage_splits_on_every_non_word_character() -> None:
    text = "Video-editor v2.0: cuts\tfilms_HD (fast!)\x1c\x7fend's 3rd\n"
    assert words(text) == reference(text)
    assert words(text) == [
        "video",
        "editor",
        "v2",
        "0",
        "cuts",
        "films_hd",
        "fast",
        "end",
        "s",
        "3rd",
    ]


def test_non_ascii_text_takes_the_regex_path() -> None:
    text = "Straße İstanbul naïve — ½ résumé ǅemal"
    assert words(text) == reference(text)


@given(st.text(alphabet=string.printable + "\x00\x1c\x1d\x7f", max_size=200))
def test_any_ascii_text_matches_the_regex(text: str) -> None:
    assert words(text) == reference(text)


@given(st.text(max_size=120))
def test_any_text_matches_the_regex(text: str) -> None:
    assert words(text) == reference(text)
