"""Snippets: the passage of a chunk that best matches the query, trimmed to a size."""

from __future__ import annotations

import re

WORD = re.compile(r"\w+", re.UNICODE)
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")


def terms(text: str) -> set[str]:
    return {w.lower() for w in WORD.findall(text) if len(w) > 2}


def best_snippet(body: str, query: str, max_chars: int) -> str:
    """The window of consecutive sentences with the most query terms, at most ``max_chars``."""
    body = body.strip()
    if len(body) <= max_chars:
        return body
    wanted = terms(query)
    sentences = [s for s in SENTENCE_END.split(body) if s.strip()]
    # Each sentence's query terms once, not once per window it falls in.
    sentence_hits = [len(terms(s) & wanted) for s in sentences]
    best, best_hits = "", -1
    for start in range(len(sentences)):
        window, hits = "", 0
        for i in range(start, len(sentences)):
            candidate = f"{window} {sentences[i]}".strip()
            if len(candidate) > max_chars and window:
                break
            window = candidate
            hits += sentence_hits[i]
        if hits > best_hits:
            best, best_hits = window, hits
    if len(best) > max_chars:
        best = best[: max_chars - 1].rsplit(" ", 1)[0] + "…"
    return best
