"""Snippets: the passage of a chunk that best matches the query, trimmed to a size."""

from __future__ import annotations

import re

from deployments.text import words

# A sentence ends at whitespace after . ! ? … or at a line break. Found by a scan that starts
# on one of those characters (a look-behind at every position cost more than the rest).
BOUNDARY = re.compile(r"[.!?…]\s+|\n+")


def terms(text: str) -> set[str]:
    return {w for w in words(text) if len(w) > 2}


def sentences(body: str) -> list[str]:
    """The non-blank sentences of ``body``, in order, with their inner whitespace kept."""
    out = []
    start = 0
    for m in BOUNDARY.finditer(body):
        end = m.start() if m.group()[0] == "\n" else m.start() + 1
        if body[start:end].strip():
            out.append(body[start:end])
        start = m.end()
    if body[start:].strip():
        out.append(body[start:])
    return out


def best_snippet(body: str, query: str, max_chars: int) -> str:
    """The window of consecutive sentences with the most query terms, at most ``max_chars``."""
    return snippet_for_terms(body, terms(query), max_chars)


def snippet_for_terms(body: str, wanted: set[str], max_chars: int) -> str:
    """``best_snippet`` for a query whose ``terms`` are ``wanted``."""
    body = body.strip()
    if len(body) <= max_chars:
        return body
    parts = sentences(body)
    # Each sentence's query terms once, not once per window it falls in.
    return snippet_of(parts, [len(wanted.intersection(words(p))) for p in parts], max_chars)


def snippet_of(parts: list[str], sentence_hits: list[int], max_chars: int) -> str:
    """The window of consecutive ``parts`` (a body's ``sentences``, longer than
    ``max_chars`` together) with the most query terms (``sentence_hits``: each part's), at
    most ``max_chars``."""
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
