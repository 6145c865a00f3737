"""Snippets: the passage of a chunk that best matches the query, trimmed to a size."""

from __future__ import annotations

import re
from bisect import bisect_right
from functools import lru_cache

from deployments.text import words

# A sentence ends at whitespace after . ! ? … or at a line break. Found by a scan that starts
# on one of those characters (a look-behind at every position cost more than the rest).
BOUNDARY = re.compile(r"[.!?…]\s+|\n+")


def terms(text: str) -> set[str]:
    return {w for w in words(text) if len(w) > 2}


def sentences(body: str) -> list[str]:
    """The non-blank sentences of ``body``, in order, with their inner whitespace kept."""
    return [body[a:b] for a, b in sentence_spans(body)]


def sentence_spans(body: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each non-blank sentence of ``body``."""
    out = []
    start = 0
    for m in BOUNDARY.finditer(body):
        end = m.start() if m.group()[0] == "\n" else m.start() + 1
        if not body[start:end].isspace() and end > start:
            out.append((start, end))
        start = m.end()
    if start < len(body) and not body[start:].isspace():
        out.append((start, len(body)))
    return out


@lru_cache(maxsize=256)
def _term_pattern(wanted: frozenset[str]) -> re.Pattern[str]:
    """Any of ``wanted`` (runs of word characters) as a whole ``\\w+`` run: ``\\b`` on both
    sides, the longest first so a term never stops inside a longer one."""
    alternatives = "|".join(map(re.escape, sorted(wanted, key=lambda t: (-len(t), t))))
    return re.compile(rf"\b(?:{alternatives})\b")


def _terms_per_sentence(body: str, spans: list[tuple[int, int]], wanted: set[str]) -> list[int]:
    """How many of ``wanted`` (lower-case words) each sentence holds. An ASCII body is
    scanned once for the terms (its lower-cased form has the same offsets); another is
    split into words sentence by sentence."""
    if not wanted:
        return [0] * len(spans)
    if not body.isascii():
        return [len(wanted.intersection(words(body[a:b]))) for a, b in spans]
    starts = [a for a, _ in spans]
    found: list[set[str]] = [set() for _ in spans]
    for m in _term_pattern(frozenset(wanted)).finditer(body.lower()):
        found[bisect_right(starts, m.start()) - 1].add(m.group())
    return [len(f) for f in found]


def best_snippet(body: str, query: str, max_chars: int) -> str:
    """The window of consecutive sentences with the most query terms, at most ``max_chars``."""
    body = body.strip()
    if len(body) <= max_chars:
        return body
    spans = sentence_spans(body)
    parts = [body[a:b] for a, b in spans]
    # Each sentence's query terms once, not once per window it falls in.
    sentence_hits = _terms_per_sentence(body, spans, terms(query))
    # A window of parts[s..e] is parts[s].strip() joined by single spaces to each following
    # part with its trailing whitespace stripped (what joining and stripping step by step
    # gives), so windows are compared by length and only the best one is built.
    first = [len(p.strip()) for p in parts]
    rest = [1 + len(p.rstrip()) for p in parts]
    best_span, best_hits = (0, 0), -1
    for start in range(len(parts)):
        size, hits, end = first[start], sentence_hits[start], start
        for i in range(start + 1, len(parts)):
            if size + rest[i] > max_chars:
                break
            size += rest[i]
            hits += sentence_hits[i]
            end = i
        if hits > best_hits:
            best_span, best_hits = (start, end), hits
    start, end = best_span
    best = " ".join([parts[start].strip(), *(p.rstrip() for p in parts[start + 1 : end + 1])])
    if len(best) > max_chars:
        best = best[: max_chars - 1].rsplit(" ", 1)[0] + "…"
    return best
