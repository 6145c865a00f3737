"""Small real transformer checkpoints built on the fly (random weights), so tests and
benchmarks exercise the real loading and batching code of the reranker without downloading
weights (none ship offline)."""

from __future__ import annotations

from pathlib import Path


def build_tiny_cross_encoder(
    path: Path, seed: int = 0, *, hidden: int = 32, layers: int = 2, heads: int = 2
) -> Path:
    """A BERT sequence classifier (one logit; 2 layers of 32 by default, ``hidden=384,
    layers=6, heads=12`` is the size of MiniLM-L6) with the MiniLM tokenizer, saved to
    ``path`` in the Hugging Face layout that ``AutoModelForSequenceClassification`` loads."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from deployments.embedding import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden if hidden <= 64 else 4 * hidden,
        max_position_embeddings=512,
    )
    config.num_labels = 1  # one relevance logit (a PretrainedConfig field)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
