"""``SearchHit.of``, the hot loops' constructor: the same hit ``SearchHit(...)`` makes, as
frozen."""

from __future__ import annotations

import dataclasses

import pytest

from deployments.protocols import ChunkRecord, SearchHit


def chunk() -> ChunkRecord:
    return ChunkRecord(
        chunk_id="c1",
        doc_id="d1",
        team_id="t",
        chunk_index=0,
        text="some text",
        title="T",
        content_hash="h",
        embed_model="m",
    )


def test_of_makes_the_hit_the_constructor_makes():
    scores = {"dense": 0.5}
    made = SearchHit.of(chunk(), 0.5, scores)
    assert made == SearchHit(chunk=chunk(), score=0.5, scores={"dense": 0.5})
    assert made.scores is scores  # the caller's dict, not a copy (fusion extends it)
    assert dataclasses.replace(made, score=0.7).score == 0.7


def test_a_hit_made_by_of_is_frozen():
    made = SearchHit.of(chunk(), 0.5, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.score = 1.0  # type: ignore[misc]
