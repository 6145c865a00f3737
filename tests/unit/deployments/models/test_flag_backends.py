"""The FlagEmbedding backends (BGE-M3 dense + sparse, the FlagReranker cross-encoder) over
tiny random XLM-RoBERTa models built here (``deployments.testing.tiny_models``; nothing
downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from deployments.errors import BackendUnavailable, InvalidInput
from deployments.models.flag import FlagCrossEncoder, FlagM3Embedder
from deployments.testing.tiny_models import build_tiny_m3, build_tiny_xlmr_reranker

TEXTS = [
    "Milvus stores the dense vectors of every chunk.",
    "short",
    "Проєкти команди використовують Milvus для пошуку.",
    "Neo4j keeps the graph of agents, projects and channels of every DAO team member.",
    "ok",
    "Which team uses the reranker?",
    "",
]
SPECIAL_IDS = {0, 1, 2, 3}  # <s> <pad> </s> <unk>: never lexical weights


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory) -> Path:
    return build_tiny_m3(tmp_path_factory.mktemp("tiny-m3"))


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory) -> Path:
    return build_tiny_xlmr_reranker(tmp_path_factory.mktemp("tiny-xlmr-reranker"))


@pytest.fixture(scope="module")
def embedder(m3_dir) -> FlagM3Embedder:
    # batch_size 3: the texts above take several forward batches.
    return FlagM3Embedder.load(str(m3_dir), "cpu", "float32", 64, 3, 1)


@pytest.fixture(scope="module")
def reranker(reranker_dir) -> FlagCrossEncoder:
    return FlagCrossEncoder.load(str(reranker_dir), "cpu", "float32", 64, 3, 1)


def count_forwards(monkeypatch, module) -> list[int]:
    """A list that grows by one on each forward call of ``module`` from now on."""
    forward = module.forward
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(module, "forward", counted)
    return calls


def test_tiny_models_have_the_bge_m3_layout(m3_dir, reranker_dir):
    from transformers import AutoTokenizer

    assert (m3_dir / "colbert_linear.pt").exists() and (m3_dir / "sparse_linear.pt").exists()
    assert json.loads((reranker_dir / "config.json").read_text())["architectures"] == [
        "XLMRobertaForSequenceClassification"
    ]
    tokenizer = AutoTokenizer.from_pretrained(reranker_dir)
    ids = tokenizer("a", "b")["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<s>" and tokens[-1] == "</s>" and tokens.count("</s>") == 3
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id) == (1, 3)
    # Letters never map to <unk>.
    assert 3 not in tokenizer("Qwerty Ґанок", add_special_tokens=False)["input_ids"]


def test_dense_vectors_are_float32_and_unit_norm(embedder):
    dense, lexical = embedder.encode(TEXTS)
    assert embedder.dim == 32
    assert dense.shape == (len(TEXTS), 32) and dense.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1.0, atol=1e-5)
    assert len(lexical) == len(TEXTS)


def test_lexical_weights_are_positive_weights_of_the_texts_own_tokens(embedder):
    _, lexical = embedder.encode(TEXTS)
    tokenizer = embedder._tokenizer
    for text, weights in zip(TEXTS, lexical, strict=True):
        ids = set(tokenizer(text, add_special_tokens=False)["input_ids"]) - SPECIAL_IDS
        assert all(type(k) is int and type(v) is float for k, v in weights.items())
        assert all(v > 0 for v in weights.values())
        assert set(weights) <= ids
        # The tiny sparse head has a positive bias: every token of the text is weighted.
        assert len(weights) >= len(ids) // 2
    assert lexical[-1] == {}  # the empty text has only special tokens


def test_same_text_gives_the_same_output(embedder):
    dense, lexical = embedder.encode([TEXTS[0], TEXTS[2], TEXTS[0]])
    again, lexical_again = embedder.encode([TEXTS[0]])
    np.testing.assert_allclose(dense[0], dense[2], atol=1e-6)
    np.testing.assert_allclose(dense[0], again[0], atol=1e-6)
    assert lexical[0] == lexical[2]
    assert lexical[0].keys() == lexical_again[0].keys()


def test_a_batch_equals_the_texts_one_by_one(embedder):
    dense, lexical = embedder.encode(TEXTS)
    for i, text in enumerate(TEXTS):
        one, one_lexical = embedder.encode([text])
        np.testing.assert_allclose(dense[i], one[0], atol=1e-5)
        assert lexical[i].keys() == one_lexical[0].keys()
        for token, weight in one_lexical[0].items():
            assert abs(lexical[i][token] - weight) < 1e-5


def test_no_texts(embedder):
    dense, lexical = embedder.encode([])
    assert dense.shape == (0, 32) and dense.dtype == np.float32
    assert lexical == []


def test_count_tokens_without_special_tokens(embedder):
    tokenizer = embedder._tokenizer
    assert embedder.count_tokens("") == 0
    for text in TEXTS:
        assert embedder.count_tokens(text) == len(tokenizer(text)["input_ids"]) - 2
    long = " ".join(["milvus"] * 200)
    assert embedder.count_tokens(long) >= 200  # not cut at max_length


def test_no_progress_bars_for_calls_of_several_batches(embedder, reranker, capfd):
    capfd.readouterr()
    embedder.encode(TEXTS * 3)
    reranker.score([("q", text) for text in TEXTS * 3])
    captured = capfd.readouterr()
    assert "Inference Embeddings" not in captured.err + captured.out
    assert "Compute Scores" not in captured.err + captured.out
    assert "pre tokenize" not in captured.err + captured.out


def test_scores_are_raw_logits_in_the_order_of_the_pairs(reranker):
    pairs = [("which projects use milvus?", text) for text in TEXTS]
    scores = reranker.score(pairs)
    assert scores.shape == (len(TEXTS),) and scores.dtype == np.float32
    assert np.all(np.isfinite(scores))
    assert np.ptp(scores) > 1e-2  # distinct enough for the order checks below
    np.testing.assert_allclose(reranker.score(pairs[::-1]), scores[::-1], atol=1e-5)
    # Raw logits, not sigmoids: not all inside (0, 1) for this model.
    assert not np.all((scores > 0) & (scores < 1))


def test_pairs_of_several_requests_score_as_each_request_alone(reranker):
    first = [("which projects use milvus?", text) for text in TEXTS]
    second = [("who keeps the graph?", text) for text in TEXTS[:4]]
    together = reranker.score(first + second)
    apart = np.concatenate([reranker.score(first), reranker.score(second)])
    np.testing.assert_allclose(together, apart, atol=1e-5)


def test_one_pair_and_no_pairs(reranker):
    one = reranker.score([("q", "Milvus stores vectors.")])
    assert one.shape == (1,) and one.dtype == np.float32
    empty = reranker.score([])
    assert empty.shape == (0,) and empty.dtype == np.float32


def test_a_missing_model_folder_is_backend_unavailable(tmp_path):
    for missing in (str(tmp_path / "absent"), "absent-model"):
        with pytest.raises(BackendUnavailable, match="not found") as embedder_error:
            FlagM3Embedder.load(missing, "cpu", "float32", 64, 4, 1)
        assert embedder_error.value.backend == "embedder"
        with pytest.raises(BackendUnavailable, match="not found") as reranker_error:
            FlagCrossEncoder.load(missing, "cpu", "float32", 64, 4, 1)
        assert reranker_error.value.backend == "reranker"


def test_an_unknown_dtype_is_invalid(m3_dir):
    with pytest.raises(InvalidInput):
        FlagM3Embedder.load(str(m3_dir), "cpu", "float64", 64, 4, 1)


def test_half_precision_on_a_cpu_stays_float32(m3_dir, reranker_dir):
    import torch

    embedder = FlagM3Embedder.load(str(m3_dir), "cpu", "float16", 64, 4, 1)
    assert (embedder.device, embedder.dtype) == ("cpu", "float32")
    assert next(embedder._model.model.parameters()).dtype is torch.float32
    dense, _ = embedder.encode(TEXTS[:2])
    assert dense.dtype == np.float32
    reranker = FlagCrossEncoder.load(str(reranker_dir), "cpu", "bfloat16", 64, 4, 1)
    assert (reranker.device, reranker.dtype) == ("cpu", "float32")
    assert next(reranker._model.model.parameters()).dtype is torch.float32
    assert reranker.score([("q", "a")]).dtype == np.float32


def test_encode_matches_flagembedding_in_one_pass_per_batch(embedder, monkeypatch):
    # The same vectors and weights as FlagEmbedding's own encode_single_device ...
    theirs = embedder._model.encode_single_device(
        list(TEXTS),
        batch_size=embedder.batch_size,
        max_length=embedder.max_length,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=False,
        device=embedder.device,
    )
    calls = count_forwards(monkeypatch, embedder._model.model)
    dense, lexical = embedder.encode(list(TEXTS))
    assert np.allclose(dense, np.asarray(theirs["dense_vecs"]), atol=1e-5)
    for ours, want in zip(lexical, theirs["lexical_weights"], strict=True):
        assert ours.keys() == {int(t) for t in want}
        for token, weight in want.items():
            assert ours[int(token)] == pytest.approx(float(weight), abs=1e-5)
    # ... without its probe pass: one forward per batch of texts.
    batches = -(-len(TEXTS) // embedder.batch_size)
    assert len(calls) == batches


def test_score_matches_flagembedding_without_its_probe_pass(reranker, monkeypatch):
    # The same logits as FlagReranker's own compute_score for non-empty passages (an empty
    # one is tokenized differently by its decode-and-retokenize path) ...
    pairs = [(q, t) for q in ("which projects use milvus?", "хто тримає граф?") for t in TEXTS if t]
    theirs = reranker._model.compute_score(
        pairs, batch_size=reranker.batch_size, max_length=reranker.max_length, normalize=False
    )
    calls = count_forwards(monkeypatch, reranker._model.model)
    np.testing.assert_allclose(reranker.score(pairs), np.asarray(theirs), atol=1e-5)
    # ... in one forward per pass of batch_size pairs (short pairs: the token budget binds not).
    assert len(calls) == -(-len(pairs) // reranker.batch_size)
