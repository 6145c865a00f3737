"""The embedding models one process serves: the primary and, during a change of model
(docs/operations.md "Changing the embedding model"), the next one, each picked by its tag
(``EmbedderSettings.embed_model_tag``). ``EmbedderModels`` holds their ``EmbedderCore``s for
the Serve shell (deployments/models/embedder.py); ``LocalModels`` is them behind the async
``Embedder`` protocol without Ray (batch jobs, scripts, tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from deployments.config import EmbedderSettings
from deployments.errors import InvalidInput
from deployments.models.embedding import EmbedderCore
from deployments.protocols import Encoded


class EmbedderModels:
    """The cores of the models served, by tag, the primary first.

    Args:
        primary: the model every caller gets unless it names another.
        others: further models (``None`` entries and repeats of a tag are ignored).
    """

    def __init__(self, primary: EmbedderSettings, *others: EmbedderSettings | None) -> None:
        self.cores: dict[str, EmbedderCore] = {}
        for settings in (primary, *others):
            if settings is not None and settings.embed_model_tag not in self.cores:
                self.cores[settings.embed_model_tag] = EmbedderCore(settings)

    @property
    def primary(self) -> EmbedderCore:
        return next(iter(self.cores.values()))

    @property
    def tags(self) -> list[str]:
        return list(self.cores)

    @property
    def loaded(self) -> bool:
        return all(core.loaded for core in self.cores.values())

    def core(self, model: str | None = None) -> EmbedderCore:
        """The core of ``model`` (``None``: the primary).

        Raises:
            InvalidInput: a model this process does not serve.
        """
        if model is None:
            return self.primary
        core = self.cores.get(model)
        if core is None:
            raise InvalidInput(
                f"embedding model {model!r} is not served here (serving {', '.join(self.cores)})"
            )
        return core

    def start(self) -> None:
        """Load every model (the primary first); idempotent."""
        for core in self.cores.values():
            core.start()

    def status(self) -> dict[str, Any]:
        """Per tag: loaded, vector size, device (``/readyz`` shows it during a change)."""
        return {
            tag: {"ready": core.loaded, "dim": core.dim, "path": core.model_path}
            for tag, core in self.cores.items()
        }


class DenseFromEncode:
    """``embed``: the dense vectors of ``encode``, for the in-process models and the
    Embedder deployment alike."""

    async def encode(
        self, texts: list[str], kind: str = "passage", *, model: str | None = None
    ) -> Encoded:
        raise NotImplementedError

    async def embed(
        self, texts: list[str], kind: str = "passage", *, model: str | None = None
    ) -> np.ndarray:
        return (await self.encode(texts, kind, model=model)).dense


class LocalModels(DenseFromEncode):
    """``EmbedderModels`` behind the async ``Embedder`` protocol (``model=`` picks one by
    tag), in the caller's process: for batch jobs, scripts and tests."""

    def __init__(self, primary: EmbedderSettings, *others: EmbedderSettings | None) -> None:
        self.models = EmbedderModels(primary, *others)

    async def encode(
        self, texts: list[str], kind: str = "passage", *, model: str | None = None
    ) -> Encoded:
        core = self.models.core(model)
        return await asyncio.to_thread(core.encode, texts, kind)

    async def status(self) -> dict[str, Any]:
        primary = self.models.primary
        return {
            "ready": self.models.loaded,
            "model": primary.settings.embed_model_tag,
            "dim": primary.dim,
            "models": self.models.status(),
        }
