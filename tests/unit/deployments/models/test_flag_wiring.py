"""The FlagEmbedding backends behind the gateway's model classes, on tiny random
XLM-RoBERTa models built here (no download): ``EmbedderCore``/``EmbedderDeployment`` with
``backend: flag_m3`` (dense + learned sparse through the batch queues) and
``RerankerCore``/``RerankerDeployment`` with ``backend: flag`` (requests of one batch share
the forward passes)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from deployments.config import EmbedderSettings, RerankerSettings
from deployments.models.embedder import EmbedderDeployment
from deployments.models.embedding import EmbedderCore, embedding_dim
from deployments.models.reranker import RerankerCore, RerankerDeployment
from deployments.testing.fakes import allow_batch_queue_outside_serve
from deployments.testing.tiny_models import build_tiny_m3, build_tiny_xlmr_reranker

TEXTS = [
    "Milvus keeps the vectors of every team.",
    "Neo4j holds the graph.",
    "The gateway fuses dense, BM25 and learned sparse lists.",
    "short",
    "Agents never touch a database directly; the gateway decides what they may see.",
]


@pytest.fixture(scope="module", autouse=True)
def batch_queues_without_serve():
    allow_batch_queue_outside_serve()


@pytest.fixture(scope="module")
def m3_settings(tmp_path_factory) -> EmbedderSettings:
    path = build_tiny_m3(tmp_path_factory.mktemp("m3") / "tiny-m3")
    return EmbedderSettings(
        backend="flag_m3", model_path=str(path), model_name="tiny-m3", forward_batch_size=2
    )


@pytest.fixture(scope="module")
def m3_core(m3_settings) -> EmbedderCore:
    core = EmbedderCore(m3_settings)
    core.start()
    return core


@pytest.fixture(scope="module")
def reranker_settings(tmp_path_factory) -> RerankerSettings:
    path = build_tiny_xlmr_reranker(tmp_path_factory.mktemp("rr") / "tiny-xlmr-reranker")
    return RerankerSettings(
        enabled=True, backend="flag", model_path=str(path), forward_batch_size=3
    )


def test_m3_settings_make_lexical_weights(m3_settings, m3_core):
    assert m3_settings.lexical
    assert embedding_dim(m3_settings) == m3_core.dim == 32
    encoded = m3_core.encode(TEXTS, "passage")
    assert encoded.dense.shape == (len(TEXTS), 32) and encoded.dense.dtype == np.float32
    assert np.allclose(np.linalg.norm(encoded.dense, axis=1), 1.0, atol=1e-5)
    assert encoded.lexical is not None and len(encoded.lexical) == len(TEXTS)
    for weights in encoded.lexical:
        assert weights and all(isinstance(t, int) and w > 0 for t, w in weights.items())
    assert np.allclose(m3_core.embed(TEXTS, "passage"), encoded.dense, atol=1e-6)
    assert m3_core.device == "cpu" and m3_core.dtype == "float32"
    assert m3_core.count_tokens("Milvus keeps the vectors") > 0


def test_m3_empty_input(m3_core):
    encoded = m3_core.encode([], "query")
    assert encoded.dense.shape == (0, 32) and encoded.lexical == []


def test_m3_batches_across_requests_and_splits_back(m3_settings, m3_core):
    expected = m3_core.encode(TEXTS, "passage")

    async def run():
        shell = EmbedderDeployment(m3_settings)
        shell.reconfigure({"max_batch_size": 64, "batch_wait_timeout_s": 0.05})
        parts = await asyncio.gather(*(shell.encode([t], "passage") for t in TEXTS))
        together = await shell.encode(TEXTS, "passage")
        status = await shell.status()
        # Each text is queued on its own: 11 texts with max_batch_size 4 run as batches of
        # at most 4 texts. (Ray keeps one queue per decorated method and process, bound to
        # the loop that first used it, so this runs in the same loop.)
        shell.reconfigure({"max_batch_size": 4})
        encode = shell.core.encode

        def counting(flat, kind):
            sizes.append(len(flat))
            return encode(flat, kind)

        shell.core.encode = counting
        many = await shell.encode(eleven, "passage")
        return parts, together, status, many

    sizes: list[int] = []
    eleven = [f"{TEXTS[i % len(TEXTS)]} ({i})" for i in range(11)]
    parts, together, status, many = asyncio.run(run())
    assert sum(sizes) == 11 and max(sizes) <= 4 and len(sizes) >= 3
    assert np.allclose(many.dense, m3_core.encode(eleven, "passage").dense, atol=1e-5)
    for i, part in enumerate(parts):
        assert part.dense.shape == (1, 32)
        assert np.allclose(part.dense[0], expected.dense[i], atol=1e-5)
        assert part.lexical is not None and part.lexical[0].keys() == expected.lexical[i].keys()
    assert np.allclose(together.dense, expected.dense, atol=1e-5)
    assert status["ready"] and status["device"] == "cpu" and status["dtype"] == "float32"
    # The five one-text requests met in fewer model batches than there were requests (the
    # sixth call is the five texts together).
    assert status["timing"]["passage_batch_n"] < len(TEXTS) + 1


def test_flag_reranker_merges_requests(reranker_settings):
    core = RerankerCore(reranker_settings)
    requests = [("milvus vectors", TEXTS[:3]), ("graph", TEXTS[1:]), ("none", [])]
    merged = core.rerank_many(requests)
    alone = [core.rerank(q, texts) for q, texts in requests]
    for got, want, (_, texts) in zip(merged, alone, requests, strict=True):
        assert got.shape == (len(texts),)
        assert np.allclose(got, want, atol=1e-5)
    assert core.device == "cpu" and core.dtype == "float32"

    async def run():
        shell = RerankerDeployment(reranker_settings)
        shell.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05})
        return await asyncio.gather(*(shell.rerank(q, texts) for q, texts in requests))

    for got, want in zip(asyncio.run(run()), alone, strict=True):
        assert np.allclose(got, want, atol=1e-5)


def test_flag_reranker_needs_a_model_path():
    from deployments.errors import InvalidInput

    with pytest.raises(InvalidInput, match="model_path"):
        RerankerCore(RerankerSettings(enabled=True, backend="flag"))
