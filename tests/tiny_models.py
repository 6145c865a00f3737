"""Small real transformer checkpoints built on the fly, so tests exercise the real loading
code of the reranker without downloading weights (none ship offline)."""

from __future__ import annotations

from pathlib import Path


def build_tiny_cross_encoder(path: Path, seed: int = 0) -> Path:
    """A 2-layer BERT sequence classifier (one logit) with the MiniLM tokenizer, saved to
    ``path`` in the Hugging Face layout that ``AutoModelForSequenceClassification`` loads."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from deployments.embedding import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
