"""The FlagEmbedding models of production: BGE-M3 (one forward pass gives the dense vector and
the learned sparse lexical weights of a text) and the bge-reranker-v2-m3 cross-encoder.

``FlagM3Embedder`` and ``FlagCrossEncoder`` are the model side only (load, encode, score);
``EmbedderCore`` and ``RerankerCore`` own settings, batching and the Serve shells. Both load
through FlagEmbedding (``BGEM3FlagModel``, ``FlagReranker``, one device, so no process pool
is ever started) and run the loaded models' forward passes themselves; its progress bars
are switched off.

FlagEmbedding and torch are imported inside the loaders: importing FlagEmbedding takes
10-20 s (it pulls in datasets, peft, accelerate), which replicas of the other backends must
not pay.

Quirks of FlagEmbedding 1.4.2 worth knowing:

- Its ``encode_single_device`` and ``compute_score`` first run the longest forward batch
  once as a probe (catching ``RuntimeError`` and out-of-memory to shrink the batch size),
  then run all batches: a call that fits in one forward batch costs two forward passes, and
  a real error surfaces as an unrelated one. So ``FlagM3Embedder.encode`` batches by length
  and calls the M3 model's forward (dense + sparse heads), and ``FlagCrossEncoder.score``
  packs the pairs by token count (``deployments.models.cross_encoding``) for the classifier.
- ``BGEM3FlagModel`` loads in float16 by default (``use_fp16=True``); it is always passed
  explicitly here. It knows ``use_bf16``; ``FlagReranker`` does not (it loads float32 and
  calls ``half()`` for ``use_fp16``), so a bfloat16 reranker is converted after loading.
- The lexical weights come back as ``{str(token_id): numpy float}`` (the largest weight of
  each token of the text, special tokens and non-positive weights dropped); here they are
  ``{int: float}``.
- Under transformers 5 ``compute_score`` builds each pair by decoding the query's and the
  passage's token ids and tokenizing the pair again (``prepare_for_model`` is gone), the
  query cut to 3/4 of ``max_length`` first. Here the tokenizer takes the pair as text and
  truncates the longer side first; pairs within ``max_length`` get the same scores.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from deployments.devices import Dtype, torch_dtype
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.models.cross_encoding import score_pairs

logger = logging.getLogger(__name__)

DTYPES = ("float32", "float16", "bfloat16")

# A hub repository id (``BAAI/bge-m3``): found in the local Hugging Face cache, never fetched.
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

# The FlagEmbedding modules whose single-device paths draw tqdm bars (for calls of at least
# one forward batch).
PROGRESS_MODULES = (
    "FlagEmbedding.inference.embedder.encoder_only.m3",
    "FlagEmbedding.inference.reranker.encoder_only.base",
)


def _prepare(backend: str, model_path: str, device: str, dtype_name: str, threads: int) -> Any:
    """Offline mode, torch's thread count and the checks before loading; the torch dtype to
    load in (float32 on a CPU, see ``devices.torch_dtype``).

    Raises:
        BackendUnavailable: when ``model_path`` is neither a folder here nor a hub name.
        InvalidInput: for a dtype other than float32, float16 or bfloat16.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if dtype_name not in DTYPES:
        raise InvalidInput(f"dtype must be one of {', '.join(DTYPES)}, got {dtype_name!r}")
    if not Path(model_path).exists() and not HUB_NAME.match(model_path):
        raise BackendUnavailable(backend, f"model path {model_path!r} not found")
    import torch

    torch.set_num_threads(threads)
    return torch_dtype(cast(Dtype, dtype_name), device)


def _load(backend: str, model_path: str, build: Any) -> Any:
    """``build()``, a hub name missing from the local cache as ``BackendUnavailable``."""
    try:
        return build()
    except OSError as exc:
        if Path(model_path).exists():
            raise
        raise BackendUnavailable(
            backend, f"model {model_path!r} not found locally (offline): {exc}"
        ) from exc


def _quiet_progress() -> None:
    """Switch off the tqdm bars of FlagEmbedding's encode and score loops (they pass
    ``disable=`` themselves, so neither ``TQDM_DISABLE`` nor a default helps). Idempotent."""
    from tqdm import tqdm

    def quiet_tqdm(*args: Any, **kwargs: Any) -> Any:
        kwargs["disable"] = True
        return tqdm(*args, **kwargs)

    def quiet_trange(*args: Any, **kwargs: Any) -> Any:
        kwargs["disable"] = True
        return tqdm(range(*args), **kwargs)

    for name in PROGRESS_MODULES:
        module = importlib.import_module(name)
        module.tqdm = quiet_tqdm  # type: ignore[attr-defined]
        module.trange = quiet_trange  # type: ignore[attr-defined]


def load_configured(cls: Any, model_path: str, settings: Any, **extra: Any) -> Any:
    """``cls.load`` (``FlagM3Embedder`` or ``FlagCrossEncoder``) with the device, dtype,
    lengths and threads of an ``EmbedderSettings``/``RerankerSettings`` section, and
    ``extra`` keyword arguments of that class."""
    from deployments.devices import resolve_device

    return cls.load(
        model_path,
        resolve_device(settings.device),
        settings.dtype,
        settings.max_length,
        settings.forward_batch_size,
        settings.threads,
        **extra,
    )


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class FlagM3Embedder:
    """BGE-M3 through FlagEmbedding's ``BGEM3FlagModel``: per text a dense, L2-normalised
    CLS vector and the sparse lexical weights, from one forward pass. Build with ``load``."""

    def __init__(self, model: Any, device: str, dtype: str, max_length: int, batch_size: int):
        self._model = model
        self._tokenizer = model.tokenizer
        self._special = {
            self._tokenizer.convert_tokens_to_ids(token)
            for name in ("cls_token", "eos_token", "pad_token", "unk_token")
            if (token := self._tokenizer.special_tokens_map.get(name))
        }
        self.device = device
        self.dtype = dtype
        self.max_length = max_length
        self.batch_size = batch_size
        self.dim = int(model.model.model.config.hidden_size)

    @classmethod
    def load(
        cls,
        model_path: str,
        device: str,
        dtype_name: str,
        max_length: int,
        batch_size: int,
        threads: int,
    ) -> FlagM3Embedder:
        """Load a BGE-M3 folder (the encoder, ``colbert_linear.pt``, ``sparse_linear.pt``) on
        ``device`` (resolved: ``cpu``, ``cuda``, ``cuda:N``) in ``dtype_name`` (float32 on a
        CPU whatever is asked). Never downloads.

        Raises:
            BackendUnavailable("embedder", ...): when the model is not there.
        """
        dtype = _prepare("embedder", model_path, device, dtype_name, threads)
        started = time.perf_counter()
        import torch
        from FlagEmbedding import BGEM3FlagModel

        _quiet_progress()
        model = _load(
            "embedder",
            model_path,
            lambda: BGEM3FlagModel(
                model_path,
                normalize_embeddings=True,
                use_fp16=dtype == torch.float16,
                use_bf16=dtype == torch.bfloat16,
                devices=[device],
                batch_size=batch_size,
                query_max_length=max_length,
                passage_max_length=max_length,
                return_dense=True,
                return_sparse=True,
                return_colbert_vecs=False,
            ),
        )
        # On the device now rather than in the first request (encode moves it again: a no-op).
        model.model.to(device).eval()
        embedder = cls(model, device, _dtype_name(dtype), max_length, batch_size)
        logger.info(
            "BGE-M3 %s loaded in %.1fs (dim=%d, device=%s, dtype=%s, threads=%d)",
            model_path,
            time.perf_counter() - started,
            embedder.dim,
            device,
            embedder.dtype,
            threads,
        )
        return embedder

    def encode(self, texts: list[str]) -> tuple[np.ndarray, list[dict[int, float]]]:
        """Dense vectors, float32 ``(len(texts), dim)`` with unit norm, and per text its
        lexical weights ``{token_id: weight}`` (positive weights only, no special tokens), in
        the order of ``texts``; forward batches of ``batch_size`` texts of similar length.

        The forward passes run here, through the loaded BGE-M3 model's own forward (dense +
        sparse heads), not through ``encode_single_device``: that one first runs its longest
        batch once more to probe the batch size, which doubled the cost of a search query."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        dense = np.empty((len(texts), self.dim), dtype=np.float32)
        lexical: list[dict[int, float]] = [{} for _ in texts]
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            batch = self._tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                out = self._model.model(
                    batch, return_dense=True, return_sparse=True, return_colbert_vecs=False
                )
            dense[idx] = out["dense_vecs"].float().cpu().numpy()
            weights = out["sparse_vecs"].squeeze(-1).float().cpu().numpy()
            ids = batch["input_ids"].cpu().numpy()
            for row, i in enumerate(idx):
                lexical[i] = self._token_weights(ids[row], weights[row])
        if self.dtype != "float32":
            # Normalised in half precision: norms off by ~1e-3, made exact again.
            norms = np.linalg.norm(dense, axis=1, keepdims=True)
            dense = dense / np.maximum(norms, 1e-12)
        return dense, lexical

    def _token_weights(self, ids: np.ndarray, weights: np.ndarray) -> dict[int, float]:
        """One text's ``{token id: weight}``: each token's largest positive weight over its
        positions, special tokens (``<s>``, ``</s>``, padding, unknown) left out."""
        out: dict[int, float] = {}
        for token, weight in zip(ids.tolist(), weights.tolist(), strict=True):
            if weight > 0 and token not in self._special and weight > out.get(token, 0.0):
                out[token] = float(weight)
        return out

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without special tokens (and without truncation)."""
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])


class FlagCrossEncoder:
    """A cross-encoder reranker (bge-reranker-v2-m3) loaded through FlagEmbedding's
    ``FlagReranker``: one raw relevance logit per (query, passage) pair. Build with ``load``.

    Scoring runs the loaded classifier in passes packed by token count
    (``deployments.models.cross_encoding``), not through ``compute_score``: that one probes its
    longest batch first (an extra pass, and a real error re-raised as an unrelated one) and,
    under transformers 5, decodes and tokenizes every pair twice."""

    def __init__(
        self,
        model: Any,
        device: str,
        dtype: str,
        max_length: int,
        batch_size: int,
        max_tokens: int,
    ):
        self._model = model
        self.device = device
        self.dtype = dtype
        self.max_length = max_length
        self.batch_size = batch_size
        self.max_tokens = max_tokens

    @classmethod
    def load(
        cls,
        model_path: str,
        device: str,
        dtype_name: str,
        max_length: int,
        batch_size: int,
        threads: int,
        max_tokens: int = 4096,
    ) -> FlagCrossEncoder:
        """Load a sequence-classification folder with one logit on ``device`` (resolved) in
        ``dtype_name`` (float32 on a CPU whatever is asked); passes of at most
        ``batch_size`` pairs and ``max_tokens`` padded tokens. Never downloads.

        Raises:
            BackendUnavailable("reranker", ...): when the model is not there.
        """
        dtype = _prepare("reranker", model_path, device, dtype_name, threads)
        started = time.perf_counter()
        import torch
        from FlagEmbedding import FlagReranker

        _quiet_progress()
        model = _load(
            "reranker",
            model_path,
            lambda: FlagReranker(
                model_path,
                use_fp16=dtype == torch.float16,
                devices=[device],
                batch_size=batch_size,
                max_length=max_length,
                normalize=False,
            ),
        )
        # FlagReranker loads float32 and knows only fp16 (``half()`` on each call): the
        # dtype is set here, once, for both.
        model.model.to(device=device, dtype=dtype).eval()
        reranker = cls(model, device, _dtype_name(dtype), max_length, batch_size, max_tokens)
        logger.info(
            "FlagReranker %s loaded in %.1fs (device=%s, dtype=%s, threads=%d)",
            model_path,
            time.perf_counter() - started,
            device,
            reranker.dtype,
            threads,
        )
        return reranker

    def _forward(self, batch: dict[str, Any]) -> Any:
        import torch

        with torch.inference_mode():
            return self._model.model(**batch, return_dict=True).logits

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Raw relevance logits (no sigmoid), float32, one per (query, passage) pair in the
        order given. The pairs of several requests share the passes."""
        return score_pairs(
            self._model.tokenizer,
            self._forward,
            pairs,
            self.device,
            max_length=self.max_length,
            max_pairs=self.batch_size,
            max_tokens=self.max_tokens,
        )
