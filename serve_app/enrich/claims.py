"""Claims of a draft answer: its sentences (split on sentence punctuation, not after common
abbreviations, list bullets and headings stripped), their content terms (stopwords dropped,
words cut to a stem length), and ``[n]`` citation markers inserted after sentences."""

from __future__ import annotations

import re
from dataclasses import dataclass

WORD = re.compile(r"\w+", re.UNICODE)
# Sentence punctuation (with closing quotes/brackets) followed by whitespace: a possible end.
BOUNDARY = re.compile(r"([.!?…]+[\"'»”’)\]]*)\s+")
# List bullets, numbering, block quotes and heading hashes at the start of a line.
LINE_PREFIX = re.compile(r"\s*(?:(?:[-*+•–—]|\d{1,3}[.)]|>)\s+)*")
HEADING = re.compile(r"\s*#{1,6}\s")
OPENERS = "([{\"'«„“‘"

# Abbreviations after which a period does not end a sentence (lower case, no final period).
# Abbreviations that often end one (etc., т.д., тис., грн.) are not here: after them a capital
# letter starts a new sentence and a lower-case word continues the same one.
NO_BREAK_ABBREVIATIONS = frozenset(
    {
        # English
        "e.g",
        "i.e",
        "eg",
        "ie",
        "cf",
        "vs",
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "st",
        "no",
        "nos",
        "fig",
        "figs",
        "approx",
        "incl",
        "esp",
        "al",
        "jr",
        "sr",
        "vol",
        "p",
        "pp",
        "sec",
        "ch",
        "ca",
        # Ukrainian
        "напр",
        "див",
        "пор",
        "т.зв",
        "т.з",
        "зокр",
        "ім",
        "вул",
        "просп",
        "м",
        "обл",
        "р-н",
        "с",
        "смт",
        "проф",
        "доц",
        "акад",
        "англ",
        "укр",
        "ст",
        "п",
        "пп",
        "рис",
        "табл",
        "гл",
    }
)

# Function words that do not count as content of a claim (English and Ukrainian).
_STOPWORD_TEXT = """
    the and for are was were been being has have had does did not but with from this that
    these those there their them they its our ours your you his her she him who whom which
    what when where why how all any both each few more most other some such than too very
    can could should would will shall may might must into onto over under about above below
    also just only then once here out off own same again further between through during
    before after while because until upon via per use used uses using
    та або але щоб що як які який яка яке цей ця це ці той та те ті там тут вже ще теж
    також для від при про під над між через після перед його її їх їхній наш наша наше наші
    ваш ваша ваше ваші свій своя своє свої він вона воно вони ми ви бути був була було були
    є має мають буде будуть може можуть ніж лише тільки дуже так ні не чи де коли чому
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def content_terms(text: str, stem_chars: int) -> set[str]:
    """The words of ``text`` that carry content: lower case, without stop words and words
    shorter than three letters (numbers are kept), each cut to ``stem_chars`` characters, a
    crude stemmer that lets inflected forms match (архітектура / архітектури, chunk / chunks)."""
    out = set()
    for word in WORD.findall(text.lower()):
        if word.isdigit():
            out.add(word)
        elif len(word) >= 3 and word not in STOPWORDS:
            out.add(word[:stem_chars])
    return out


@dataclass(frozen=True)
class Sentence:
    """A sentence of the draft: ``text`` is ``draft[start:end]`` without its list marker."""

    text: str
    start: int
    end: int


def _ends_sentence(line: str, match: re.Match[str]) -> bool:
    punct = match.group(1)
    if "!" in punct or "?" in punct:
        return True
    following = line[match.end() : match.end() + 1]
    if following and following.islower():
        # "e.g. the", "т.д. та", "3 тис. грн": a lower-case word continues the sentence.
        return False
    if punct.startswith("."):
        before = line[: match.start()].split()
        token = before[-1].lstrip(OPENERS) if before else ""
        if token.lower() in NO_BREAK_ABBREVIATIONS:
            return False
        # An initial: "J. Smith", "Т. Шевченко".
        if len(token) == 1 and token.isupper():
            return False
    return True


def split_sentences(text: str) -> list[Sentence]:
    """Sentences of ``text`` with their offsets. A line break always ends a sentence (list
    items, paragraphs); inside a line a sentence ends at ``.``, ``!``, ``?`` or ``…`` followed
    by a space, except after a known abbreviation, an initial, or before a lower-case word.
    Decimals (``3.5``) never split: no space follows their point. Markdown headings are not
    sentences."""
    sentences: list[Sentence] = []
    for line_match in re.finditer(r"[^\n]+", text):
        line, base = line_match.group(), line_match.start()
        if HEADING.match(line):
            continue
        start = LINE_PREFIX.match(line).end()  # type: ignore[union-attr]  # always matches
        for match in BOUNDARY.finditer(line, start):
            if _ends_sentence(line, match):
                sentences.append(_sentence(text, base + start, base + match.end(1)))
                start = match.end()
        sentences.append(_sentence(text, base + start, base + len(line)))
    return [s for s in sentences if s.text]


def _sentence(text: str, start: int, end: int) -> Sentence:
    piece = text[start:end]
    stripped = piece.strip()
    if not stripped:
        return Sentence("", start, start)
    start += len(piece) - len(piece.lstrip())
    return Sentence(stripped, start, start + len(stripped))


def extract_claims(text: str, min_chars: int, stem_chars: int) -> list[Sentence]:
    """The sentences that are claims: at least ``min_chars`` long with a content word."""
    return [
        s
        for s in split_sentences(text)
        if len(s.text) >= min_chars and content_terms(s.text, stem_chars)
    ]


def insert_markers(text: str, markers: dict[int, list[int]]) -> str:
    """``text`` with ``[n]`` markers inserted at the offsets given (``offset → [n, ...]``):
    right after closing punctuation, else after one space. Nothing else changes."""
    out, last = [], 0
    for offset in sorted(markers):
        numbers = markers[offset]
        if not numbers:
            continue
        out.append(text[last:offset])
        tail = text[offset - 1] if offset > 0 else ""
        sep = "" if tail and not tail.isalnum() and tail not in "_%" else " "
        out.append(sep + "".join(f"[{n}]" for n in numbers))
        last = offset
    out.append(text[last:])
    return "".join(out)
