"""The lexical check of a near-duplicate cache hit (issue 38, item 7).

Two queries whose embeddings are close can still ask different things: "install X on Debian
12" and "install X on Debian 11", "files with links" and "files without links", "image
viewer" and "image editor" can have a cosine above 0.95 with a small embedder. A near hit is
served only when the two queries agree in their words: the same *content terms* — casefolded
word tokens (Unicode-aware; versions such as ``3.10``, ``c++`` and ``node_modules`` stay one
token, hyphens and slashes split) less a small list of stopwords (articles, auxiliaries,
pronouns, common prepositions), with contractions spelled out (``don't`` -> ``do not``) — so
that case, punctuation, stopwords and word order may differ. *Protected* terms — anything
with a digit, negations (``not``, ``no``, ``without``, ...) and number words — must match
exactly, as a multiset; the other content terms must have a multiset Jaccard of at least
``min_jaccard`` (1.0, the default: the same multiset). Question words (how, why, what, ...)
are content terms.

Known limit: word order is ignored, so "convert A to B" and "convert B to A" agree."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

# Letters and digits, joined by . _ : inside a token (versions, host names, identifiers), with
# a trailing run of + or # (c++, c#). A hyphen or slash splits ("gateway-search" is
# "gateway search").
_TOKEN = re.compile(r"[^\W_]+(?:[._:][^\W_]+)*[+#]*")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_CONTRACTIONS = (
    (re.compile(r"\bcan't\b|\bcannot\b"), "can not"),
    (re.compile(r"\bwon't\b"), "will not"),
    (re.compile(r"\bshan't\b"), "shall not"),
    (re.compile(r"n't\b"), " not"),
    (re.compile(r"'(s|re|ve|ll|d|m)\b"), ""),
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _words(
    """
    a an the
    is are was were be been being am do does did doing done have has had having
    i me my mine we us our ours you your yours he him his she her hers it its they them their
    theirs this that these those there here
    of to in on at for from by with about into onto as and or
    can could should would will shall may might must
    please some any just also so such very really
    """
)
NEGATIONS = _words("not no never none nor neither nothing nobody nowhere without except unless")
NUMBER_WORDS = _words(
    """
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
    fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy
    eighty ninety hundred thousand million billion
    first second third fourth fifth sixth seventh eighth ninth tenth last
    once twice half double single
    """
)


@dataclass(frozen=True)
class Terms:
    """A query's content terms: ``protected`` must match exactly, ``words`` by Jaccard."""

    protected: Counter[str]
    words: Counter[str]

    @property
    def empty(self) -> bool:
        return not self.protected and not self.words


def tokens(text: str) -> list[str]:
    """``text`` as casefolded word tokens, contractions spelled out, punctuation dropped."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_APOSTROPHES)
    for pattern, spelled in _CONTRACTIONS:
        text = pattern.sub(spelled, text)
    return _TOKEN.findall(text)


def _protected(token: str) -> bool:
    return token in NEGATIONS or token in NUMBER_WORDS or any(c.isdigit() for c in token)


def terms(text: str) -> Terms:
    """The content terms of ``text``. A query of stopwords only keeps them all (so that
    "how is it" and "how was it" still differ)."""
    found = tokens(text)
    content = [t for t in found if t not in STOPWORDS] or found
    protected = Counter(t for t in content if _protected(t))
    words = Counter(t for t in content if not _protected(t))
    return Terms(protected, words)


def jaccard(a: Counter[str], b: Counter[str]) -> float:
    """The multiset Jaccard of ``a`` and ``b`` (1.0 for two empty ones)."""
    union = sum((a | b).values())
    return sum((a & b).values()) / union if union else 1.0


def agree(a: Terms, b: Terms, min_jaccard: float = 1.0) -> bool:
    """Whether two queries ask the same thing, by their words (see the module's doc)."""
    if a.empty or b.empty or a.protected != b.protected:
        return False
    if min_jaccard >= 1.0:
        return a.words == b.words
    return jaccard(a.words, b.words) >= min_jaccard
