"""Snippets: the passage of a chunk that best matches the query, trimmed to a size."""

from __future__ import annotations

import re

WORD = re.compile(r"\w+", re.UNICODE)
# A sentence ends at whitespace after . ! ? … or at a line break. Found by a scan that starts
# on one of those characters (a look-behind at every position cost more than the rest).
BOUNDARY = re.compile(r"[.!?…]\s+|\n+")


def terms(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if len(w) > 2}


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
    body = body.strip()
    if len(body) <= max_chars:
        return body
    wanted = terms(query)
    parts = sentences(body)
    # Each sentence's query terms once, not once per window it falls in; only the query's
    # terms are collected (every one is longer than two characters already).
    sentence_hits = [len(wanted.intersection(WORD.findall(s.lower()))) for s in parts]
    best, best_hits = "", -1
    for start in range(len(parts)):
        window, hits = "", 0
        for i in range(start, len(parts)):
            candidate = f"{window} {parts[i]}".strip()
            if len(candidate) > max_chars and window:
                break
            window = candidate
            hits += sentence_hits[i]
        if hits > best_hits:
            best, best_hits = window, hits
    if len(best) > max_chars:
        best = best[: max_chars - 1].rsplit(" ", 1)[0] + "…"
    return best
