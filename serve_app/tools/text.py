"""Tool answers as plain text for a model to read: each hit as a citation (title or path,
url, excerpt), the degraded warning on the first line, the whole text at most 16 KiB (UTF-8)
so a long answer is cut at a line — never the warning."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from serve_app.enrich.contracts import EnrichAnswerResponse
from serve_app.graph.contracts import ExplainPathResponse, GraphQueryResponse
from serve_app.search.contracts import SearchDocsResponse

MAX_TEXT_BYTES = 16 * 1024
TRUNCATED = "[… truncated at 16 KiB]"


def render(response: BaseModel, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of one tool response."""
    head = _head(response)
    if isinstance(response, SearchDocsResponse):
        body = _search(response)
    elif isinstance(response, EnrichAnswerResponse):
        body = _enrich(response)
    elif isinstance(response, ExplainPathResponse):
        body = _path(response)
    elif isinstance(response, GraphQueryResponse):
        body = _rows(response)
    else:  # pragma: no cover - every tool response is one of the above
        body = [response.model_dump_json()]
    return _cap(head, body, max_bytes)


def _head(response: Any) -> list[str]:
    lines = []
    if getattr(response, "degraded", False):
        reasons = "; ".join(response.degraded_reasons) or "a backend did not answer"
        lines.append(f"WARNING degraded: {reasons}")
    cache = getattr(response, "cache", None)
    if cache is not None and cache.hit:
        lines.append(f"(served from cache, {cache.age_s:.0f} s old)")
    return lines


def _search(r: SearchDocsResponse) -> list[str]:
    if not r.matches:
        note = getattr(r, "notice", None)
        return [note or "No matching documents in this team's knowledge base."]
    out = [f"{_count(len(r.matches), 'passage')} (search: {r.mode}):"]
    number = {m.chunk_id: i for i, m in enumerate(r.matches, 1)}
    for i, m in enumerate(r.matches, 1):
        where = m.source_ref.url or f"{m.source_ref.doc_type}:{m.source_ref.id}"
        out.append(f"[{i}] {m.title} — {where} (score {m.score:.2f})")
        if m.duplicate_of in number:  # the text is that match's: said once
            out.append(f"    (the same text as [{number[m.duplicate_of]}])")
        else:
            out.append(f"    {' '.join(m.snippet.split())}")
    return out


def _enrich(r: EnrichAnswerResponse) -> list[str]:
    out = [r.enriched_answer, ""]
    if r.sources:
        out.append("Sources:")
        for s in r.sources:
            out.append(f"[{s.marker}] {s.title} — {s.url or s.id}")
            out.append(f"    {' '.join(s.snippet.split())}")
    if r.unsupported_claims:
        out.append("Not supported by any document:")
        out.extend(f"- {c}" for c in r.unsupported_claims)
    return out


def _path(r: ExplainPathResponse) -> list[str]:
    out = [r.explanation]
    out.extend(f"- {p.sentence}" for p in r.paths if p.sentence != r.explanation)
    return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _rows(r: GraphQueryResponse) -> list[str]:
    if not r.rows:
        return ["No rows."]
    out = [f"{_count(len(r.rows), 'row')} ({', '.join(r.columns)}):"]
    out.extend(json.dumps(row, ensure_ascii=False, default=str) for row in r.rows)
    return out


def _cap(head: list[str], body: list[str], max_bytes: int) -> str:
    """``head`` then as many whole lines of ``body`` as fit in ``max_bytes``; a line that
    alone does not fit is cut at a character boundary, any other is left out whole."""
    marker = len(TRUNCATED.encode()) + 1
    # The head (the degraded warning) comes first and stays, cut to half the budget at most.
    text = _cut("\n".join(head), max_bytes // 2)
    used = len(text.encode())
    kept: list[str] = []
    for i, line in enumerate(body):
        size = len(line.encode()) + (1 if used or kept else 0)
        rest = len(body) - i - 1
        if used + size + (marker if rest else 0) <= max_bytes:
            kept.append(line)
            used += size
            continue
        # Cut at a line: the answer ends with the last whole line that fits. Only a line
        # that could never fit (longer than what the head leaves) is cut inside, at a
        # character boundary, so that its start is not lost too.
        room = max_bytes - used - marker - 1
        if room > 0 and size > max_bytes - len(text.encode()) - marker:
            kept.append(_cut(line, room))
        kept.append(TRUNCATED)
        break
    return "\n".join(([text] if text else []) + kept)


def _cut(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` of UTF-8 at a character boundary."""
    data = text.encode()
    return text if len(data) <= max_bytes else data[:max_bytes].decode(errors="ignore")
