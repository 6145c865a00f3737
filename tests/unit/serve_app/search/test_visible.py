"""The result filter behind every store filter: each record judged, once per record."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deployments.protocols import ChunkRecord, SearchHit
from serve_app.search.retrieval import _visible

OPEN = ChunkRecord(
    chunk_id="c1",
    doc_id="d1",
    team_id="t",
    text="x",
    title="",
    heading="",
    url="",
    doc_type="doc",
    chunk_index=0,
    embed_model="m",
    content_hash="h",
)


class Judge:
    """Admits records whose ACL is open; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def may_see_each(self, chunks: list[ChunkRecord]) -> list[bool]:
        self.calls += len(chunks)
        return [not chunk.acl_deny for chunk in chunks]


def test_a_record_found_by_two_methods_is_judged_once() -> None:
    judge: Any = Judge()
    lists = {"dense": [SearchHit(OPEN, 0.9)], "bm25": [SearchHit(OPEN, 3.0)]}
    assert {m: len(h) for m, h in _visible(lists, judge).items()} == {"dense": 1, "bm25": 1}
    assert judge.calls == 1


def test_two_reads_of_one_chunk_that_differ_are_each_judged() -> None:
    # One method read the chunk before its ACL was tightened, the other after: the tightened
    # record must not ride on the verdict of the open one.
    judge: Any = Judge()
    tightened = replace(OPEN, acl_deny=("user:x",))
    lists = {"dense": [SearchHit(OPEN, 0.9)], "bm25": [SearchHit(tightened, 3.0)]}
    out = _visible(lists, judge)
    assert [h.chunk for h in out["dense"]] == [OPEN] and out["bm25"] == []
    assert judge.calls == 2
