"""Words of a text as the gateway counts them everywhere: the lower-cased ``\\w+`` runs (the
tokens of Milvus Lite's ``standard`` analyzer, the BM25 postings, near-duplicate shingles,
snippet matching).

``words`` gives exactly ``WORD.findall(text.lower())``; an ASCII text (most passages) takes a
path without the regex: its non-word characters mapped to spaces and split, ~2x faster on
real passages, so a search's per-passage steps (shingles, snippets) cost less."""

from __future__ import annotations

import re
import string

WORD = re.compile(r"\w+", re.UNICODE)

# Every ASCII character that is not a word character (``\w`` in ASCII is [A-Za-z0-9_]) → " ".
_WORD_CHARS = frozenset(string.ascii_letters + string.digits + "_")
_SPACES = str.maketrans({chr(i): " " for i in range(128) if chr(i) not in _WORD_CHARS})


def words(text: str) -> list[str]:
    """The lower-cased ``\\w+`` runs of ``text``, in order."""
    if text.isascii():
        return text.lower().translate(_SPACES).split()
    return WORD.findall(text.lower())
