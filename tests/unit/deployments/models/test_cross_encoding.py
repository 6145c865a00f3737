"""Pairs packed into forward passes by token count (deployments.models.cross_encoding), on the
MiniLM tokenizer that ships offline and a tiny cross-encoder built here."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.models import cross_encoding
from deployments.models.embedding import default_model_path
from deployments.testing.tiny_models import build_tiny_cross_encoder

QUERIES = ["which projects use milvus?", "who keeps the graph of the DAO?"]
PASSAGES = [
    "Milvus stores the dense vectors of every chunk.",
    "short",
    "Проєкти команди використовують Milvus для пошуку.",
    "Neo4j keeps the graph of agents, projects and channels of every DAO team member. " * 6,
    "ok",
    "The reranker rescoring the fused candidates of a search runs in its own replica.",
]
PAIRS = [(q, p) for q in QUERIES for p in PASSAGES]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path())


def lengths(tokenizer, pairs, max_length=512):
    return [
        len(tokenizer(q, p, truncation=True, max_length=max_length)["input_ids"]) for q, p in pairs
    ]


def test_every_pair_in_one_pass_within_the_limits(tokenizer):
    passes = cross_encoding.pack(tokenizer, PAIRS, max_length=512, max_pairs=3, max_tokens=80)
    rows = [i for p in passes for i in p.rows]
    assert sorted(rows) == list(range(len(PAIRS)))
    n = lengths(tokenizer, PAIRS)
    assert [n[i] for i in rows] == sorted(n)  # shortest first
    for p in passes:
        width = p.inputs["input_ids"].shape[1]
        assert len(p.rows) <= 3 and width == max(n[i] for i in p.rows)
        # Over the token budget only a pair alone in its pass.
        assert len(p.rows) * width <= 80 or len(p.rows) == 1
    assert any(len(p.rows) == 1 and n[p.rows[0]] > 80 for p in passes)


def test_a_pass_holds_what_the_tokenizer_pads_itself(tokenizer):
    passes = cross_encoding.pack(tokenizer, PAIRS, max_length=24, max_pairs=4, max_tokens=10**6)
    for p in passes:
        want = tokenizer(
            [PAIRS[i][0] for i in p.rows],
            [PAIRS[i][1] for i in p.rows],
            padding=True,
            truncation=True,
            max_length=24,
            return_tensors="np",
        )
        assert set(p.inputs) == {"input_ids", "attention_mask", "token_type_ids"}
        for key, value in p.inputs.items():
            assert value.dtype == np.int64
            np.testing.assert_array_equal(value, want[key])


def test_left_padding_when_the_tokenizer_pads_left(tokenizer):
    from transformers import AutoTokenizer

    left = AutoTokenizer.from_pretrained(default_model_path(), padding_side="left")
    for p in cross_encoding.pack(left, PAIRS, max_length=64, max_pairs=4, max_tokens=10**6):
        mask = p.inputs["attention_mask"]
        assert np.all(mask[:, -1] == 1)
        assert np.all(p.inputs["input_ids"][mask == 0] == tokenizer.pad_token_id)


def test_no_pairs_no_passes(tokenizer):
    assert cross_encoding.pack(tokenizer, [], max_length=64, max_pairs=4, max_tokens=64) == []


def test_relevance_of_one_and_two_labels():
    import torch

    np.testing.assert_allclose(cross_encoding.relevance(torch.tensor([[0.5], [-2.0]])), [0.5, -2.0])
    np.testing.assert_allclose(
        cross_encoding.relevance(torch.tensor([[1.0, 4.0], [2.0, -1.0]])), [3.0, -3.0]
    )


def test_packed_scores_equal_each_pair_scored_alone(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = build_tiny_cross_encoder(tmp_path)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    calls = []

    def forward(batch):
        calls.append(batch["input_ids"].shape)
        with torch.inference_mode():
            return model(**batch).logits

    scores = cross_encoding.score_pairs(
        tok, forward, PAIRS, "cpu", max_length=128, max_pairs=4, max_tokens=200
    )
    assert scores.shape == (len(PAIRS),) and scores.dtype == np.float32
    alone = []
    for q, p in PAIRS:
        with torch.inference_mode():
            logits = model(**tok(q, p, truncation=True, max_length=128, return_tensors="pt")).logits
        alone.append(float(logits[0, 0]))
    np.testing.assert_allclose(scores, alone, atol=1e-5)
    assert len(calls) == len(
        cross_encoding.pack(tok, PAIRS, max_length=128, max_pairs=4, max_tokens=200)
    )
    assert all(rows * width <= 200 or rows == 1 for rows, width in calls)
