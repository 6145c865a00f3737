"""Cross-encoder scoring of (query, passage) pairs in forward passes packed by token count.

All pairs of a call are tokenized once, without padding; ordered by their token count, they
are cut into passes of at most ``max_pairs`` pairs and ``max_tokens`` padded tokens (pairs ×
the longest pair of the pass), and each pass is padded only to its own longest pair. A CPU
pass costs about in proportion to its padded tokens, so this wastes little on padding; on a
GPU larger budgets fill the device. A pair longer than the budget gets a pass of its own.

Used by both cross-encoder backends (``RerankerCore`` with a plain sequence classifier,
``flag.FlagCrossEncoder`` with the model FlagReranker loaded), so the pairs of every
request of a Serve batch share the passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np


class Pass(NamedTuple):
    """One forward pass: the positions of its pairs in the call, and the padded model
    inputs (``input_ids``, ``attention_mask``, and ``token_type_ids`` where the tokenizer
    makes them), int64 arrays of ``(len(rows), longest)``."""

    rows: list[int]
    inputs: dict[str, np.ndarray]


def pack(
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    *,
    max_length: int,
    max_pairs: int,
    max_tokens: int,
) -> list[Pass]:
    """The passes of ``pairs``, shortest pairs first; every pair in exactly one pass, each
    pair truncated to ``max_length`` tokens (longest side first)."""
    if not pairs:
        return []
    encoded = tokenizer(
        [query for query, _ in pairs],
        [passage for _, passage in pairs],
        truncation=True,
        max_length=max_length,
    )
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded]
    lengths = [len(ids) for ids in encoded["input_ids"]]
    order = sorted(range(len(pairs)), key=lengths.__getitem__)
    groups: list[list[int]] = [[]]
    for i in order:
        group = groups[-1]
        # Ascending lengths: pair i is the longest of the pass it joins.
        if group and (len(group) >= max_pairs or (len(group) + 1) * lengths[i] > max_tokens):
            groups.append(group := [])
        group.append(i)
    pad = {
        "input_ids": tokenizer.pad_token_id or 0,
        "attention_mask": 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0),
    }
    left = getattr(tokenizer, "padding_side", "right") == "left"
    passes = []
    for group in groups:
        longest = lengths[group[-1]]
        inputs = {k: np.full((len(group), longest), pad[k], dtype=np.int64) for k in keys}
        for row, i in enumerate(group):
            n = lengths[i]
            cols = slice(longest - n, longest) if left else slice(0, n)
            for k in keys:
                inputs[k][row, cols] = encoded[k][i]
        passes.append(Pass(group, inputs))
    return passes


def relevance(logits: Any) -> np.ndarray:
    """Scores from a classifier's logits (a torch tensor ``(n, labels)``), float32: the
    logit itself for one label (bge-reranker), relevant minus irrelevant for two."""
    logits = logits.float().cpu()
    if logits.shape[-1] == 1:
        return logits[:, 0].numpy()
    return (logits[:, -1] - logits[:, 0]).numpy()


def score_pairs(
    tokenizer: Any,
    forward: Callable[[dict[str, Any]], Any],
    pairs: Sequence[tuple[str, str]],
    device: str,
    *,
    max_length: int,
    max_pairs: int,
    max_tokens: int,
) -> np.ndarray:
    """One relevance score per pair, in the order of ``pairs``: ``forward`` (torch tensors
    on ``device`` in, logits out) called once per pass of ``pack``."""
    import torch

    scores = np.empty(len(pairs), dtype=np.float32)
    for rows, inputs in pack(
        tokenizer, pairs, max_length=max_length, max_pairs=max_pairs, max_tokens=max_tokens
    ):
        batch = {k: torch.from_numpy(v).to(device) for k, v in inputs.items()}
        scores[rows] = relevance(forward(batch))
    return scores
