"""The embedder's Serve shell: ``EmbedderDeployment`` loads ``EmbedderCore``
(deployments/models/embedding.py) in the background and batches concurrent requests with
``@serve.batch``. It reports the texts it holds to Serve's autoscaler
(deployments/models/autoscale.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ray import serve

from deployments.config import EMBED_BATCH, EMBED_BATCH_WAIT_S, EmbedderSettings
from deployments.devices import actor_options
from deployments.errors import InvalidInput
from deployments.health import check_model
from deployments.loading import BackgroundLoad
from deployments.metrics import EMBEDDER_BATCH_SIZE, EMBEDDER_QUEUE_WAIT
from deployments.models.autoscale import backlog_metrics
from deployments.models.embedder_models import DenseFromEncode, EmbedderModels
from deployments.priority import lower_priority
from deployments.protocols import Encoded
from deployments.serve_log import route_logs_to_serve
from deployments.timing import MeanTimes

logger = logging.getLogger(__name__)


# Query batches up to this many characters are embedded on the replica's event loop.
INLINE_QUERY_CHARS = 4096


# One request in a batch queue: when it was queued (``time.perf_counter``), its text and the
# tag of the model to embed it with (one queue serves every model: Ray keeps one queue per
# decorated method and process).
Queued = tuple[float, str, str]


def deployment_options(settings: EmbedderSettings) -> dict[str, Any]:
    """Serve options of ``EmbedderDeployment`` (serve_config.yaml's ``deployments`` may
    override any of them)."""
    return {
        "name": "Embedder",
        # Batches fill only when enough requests may be in flight at once.
        "max_ongoing_requests": max(256, settings.max_batch_size * 4),
        # On a GPU (device cuda, or auto on a cluster with GPUs) it also asks for num_gpus.
        "ray_actor_options": actor_options(settings.device, settings.num_cpus, settings.num_gpus),
        "user_config": {
            "max_batch_size": settings.max_batch_size,
            "batch_wait_timeout_s": settings.batch_wait_timeout_s,
            "query_batch_wait_timeout_s": settings.query_batch_wait_timeout_s,
        },
    }


class EmbedderDeployment(DenseFromEncode):
    """Serve shell: loads the model in the background and batches texts across callers.

    Queries and passages have separate batch queues, so a search never waits behind a large
    ingestion batch. Each text is queued on its own, so a batch of ``max_batch_size``
    requests is ``max_batch_size`` texts. (A ``batch_size_fn`` counting texts per request
    would do the same, but Ray 2.60 re-evaluates it over the whole batch for each arrival:
    quadratic, ~16 ms per batch of 128 on an H200's host; bench/README.md "GPU check".)

    During a change of model (``next_settings``) it loads the next model too; a caller names
    it with ``model=<tag>``, and a batch holding texts of both models runs each model once.

    ``backlog`` counts the texts in its batch queues or in a running batch, per kind, and
    ``record_autoscaling_stats`` reports them, so that an ``autoscaling_config`` with the
    queued-texts policy (deployments/models/autoscale.py) scales on texts, not requests.
    """

    def __init__(
        self, settings: EmbedderSettings, next_settings: EmbedderSettings | None = None
    ) -> None:
        route_logs_to_serve()
        self.models = EmbedderModels(settings, next_settings)
        self.core = self.models.primary
        self.niceness = _lower_priority(settings)
        # Texts queued or in a running batch, per kind (``_through``).
        self.backlog = {"passage": 0, "query": 0}
        # In-replica time per call and per model batch (status(), so /readyz shows it).
        self._timing = MeanTimes()
        self._loading = BackgroundLoad(self.models.start, "embedder")
        self._loading.begin()

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
                queue.set_max_batch_size(int(user_config["max_batch_size"]))
            if wait is not None:
                queue.set_batch_wait_timeout_s(float(wait))

    async def check_health(self) -> None:
        """Serve's health check: fails the replica whose model failed to load. It runs
        every few seconds, so it also hands an idle replica's freed memory back."""
        check_model(self._loading)
        for core in self.models.cores.values():
            if core.loaded:
                core.release_memory()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics (Ray 2.60 calls this on the replica every few
        seconds while the deployment has an ``autoscaling_config``): the texts held now."""
        return backlog_metrics(self.backlog["passage"], self.backlog["query"])

    async def status(self) -> dict[str, Any]:
        more = {"models": self.models.status()} if len(self.models.cores) > 1 else {}
        return {
            **more,
            "ready": self.models.loaded,
            "model": self.core.settings.embed_model_tag,
            "path": self.core.model_path,
            "dim": self.core.dim,
            "device": self.core.device,
            "dtype": self.core.dtype,
            "backend": self.core.settings.backend,
            "threads": self.core.settings.threads,
            "niceness": self.niceness,
            "error": self._loading.error,
            "timing": self._timing.snapshot(),
        }

    async def encode(
        self, texts: list[str], kind: str = "passage", *, model: str | None = None
    ) -> Encoded:
        """Dense vectors and, with a BGE-M3 model, learned sparse weights (``Encoded``), by
        the model tagged ``model`` (``None``: the primary; one not served: ``InvalidInput``)."""
        if kind not in ("query", "passage"):
            raise InvalidInput(f"kind must be 'query' or 'passage', got {kind!r}")
        core = self.models.core(model)
        if not self.models.loaded:
            await self._loading.wait()
        if not texts:
            return core.encode([], kind)
        tag = core.settings.embed_model_tag
        queue = self._embed_queries if kind == "query" else self._embed_passages
        started = time.perf_counter()
        if len(texts) == 1:
            parts: list[Encoded] = [await self._through(queue, (started, texts[0], tag), kind)]
        else:
            parts = await asyncio.gather(
                *(self._through(queue, (started, text, tag), kind) for text in texts)
            )
        self._timing.add(f"{kind}_call", started)
        return Encoded.join(parts)

    async def _through(
        self, queue: Callable[[Queued], Awaitable[Encoded]], request: Queued, kind: str
    ) -> Encoded:
        """One text through its batch queue, counted in ``backlog`` from the moment it enters
        the queue until its batch answered (or failed, or its caller gave up)."""
        self.backlog[kind] += 1
        try:
            return await queue(request)
        finally:
            self.backlog[kind] -= 1

    async def _run(self, requests: list[Queued], kind: str) -> list[Encoded]:
        # Flatten the requests of one batch, embed once, split back. A small query batch runs
        # on the event loop itself: handing a ~10 ms forward pass to a worker thread made it
        # ~20 % slower and cut query throughput to a third (GIL hand-offs; bench/README.md).
        # Anything larger runs off the loop, so the replica keeps answering meanwhile.
        started = time.perf_counter()
        EMBEDDER_BATCH_SIZE.observe(len(requests), kind=kind)
        for queued, _, _ in requests:
            EMBEDDER_QUEUE_WAIT.observe(started - queued, kind=kind)
        out: list[Encoded | None] = [None] * len(requests)
        for tag, positions in _by_model(requests).items():
            flat = [requests[i][1] for i in positions]
            core = self.models.core(tag)
            if kind == "query" and sum(len(t) for t in flat) <= INLINE_QUERY_CHARS:
                encoded = core.encode(flat, kind)
            else:
                loop = asyncio.get_running_loop()
                encoded = await loop.run_in_executor(None, core.encode, flat, kind)
            for j, i in enumerate(positions):
                out[i] = encoded.part(j, j + 1)
        self._timing.add(f"{kind}_batch", started, len(requests))
        return [part for part in out if part is not None]

    @serve.batch(max_batch_size=EMBED_BATCH, batch_wait_timeout_s=0.0)
    async def _embed_queries(self, requests: list[Queued]) -> list[Encoded]:
        return await self._run(requests, "query")

    @serve.batch(
        max_batch_size=EMBED_BATCH,
        batch_wait_timeout_s=EMBED_BATCH_WAIT_S,
    )
    async def _embed_passages(self, requests: list[Queued]) -> list[Encoded]:
        return await self._run(requests, "passage")

    async def count_tokens(self, text: str) -> int:
        return self.core.count_tokens(text)


def _by_model(requests: list[Queued]) -> dict[str, list[int]]:
    """Positions of a batch's requests per model tag (one forward loop per model)."""
    out: dict[str, list[int]] = {}
    for i, (_, _, tag) in enumerate(requests):
        out.setdefault(tag, []).append(i)
    return out


def _lower_priority(settings: EmbedderSettings) -> int | None:
    """Raise this replica's niceness by ``settings.nice`` on a CPU device, every thread of
    its process (deployments/priority.py); the niceness it runs at (``None`` where the OS has
    none)."""
    try:
        if settings.nice and settings.device == "cpu":
            return lower_priority(settings.nice)
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return None
