"""A search query's vectors: its embedding within the embedding deadline, the learned sparse
weights an embedder like BGE-M3 makes beside it (remembered between the embedding and the
search), and during a change of model the vectors of the other served models."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import numpy as np

from deployments.errors import BackendUnavailable
from deployments.protocols import Embedder
from serve_app.search.contracts import SearchDocsRequest
from serve_app.search.query_models import QueryModels
from serve_app.settings import GatewaySettings
from serve_app.timing import stage

# Queries whose learned sparse weights are remembered between the embedding and the search
# (the semantic cache and enrich embed first, then search with the vector they got).
LEXICAL_MEMORY = 512


class QueryVectors:
    """Embeds search queries with the gateway's embedder. Holds only the recent queries'
    learned sparse weights."""

    def __init__(self, settings: GatewaySettings, embedder: Embedder) -> None:
        self.settings = settings
        self.embedder = embedder
        # A BGE-M3 embedder's learned sparse weights of recent queries (``embed``).
        self._lexical: OrderedDict[str, dict[int, float]] = OrderedDict()
        # During a change of model: the query's vector of each served model.
        models = [e.embed_model_tag for e in settings.embedders]
        self.models = QueryModels(embedder, models[0], models[1:], settings.search.embed_deadline_s)

    @property
    def lexical(self) -> bool:
        """Whether hybrid searches fuse the learned sparse list (the embedder makes it)."""
        return self.settings.embedder.lexical

    async def vector(self, query: str, given: list[float] | None = None) -> list[float] | None:
        """The query's embedding (``given`` when the caller has it), as a list of floats."""
        if given is not None:
            return given
        with stage("embed"):
            return _as_list((await self.embed([query]))[0])

    async def embed(self, queries: list[str]) -> Any:
        """Query embeddings within ``search.embed_deadline_s``. From an embedder that makes
        learned sparse weights too, those are remembered for the searches that follow.

        Raises:
            BackendUnavailable: the embedder failed or did not answer in time.
        """
        deadline = self.settings.search.embed_deadline_s
        try:
            async with asyncio.timeout(deadline):
                if not self.lexical:
                    return await self.embedder.embed(queries, "query")
                encoded = await self.embedder.encode(queries, "query")
        except TimeoutError:
            raise BackendUnavailable(
                "embedder", f"no query embedding within {deadline:g} s"
            ) from None
        for query, weights in zip(queries, encoded.lexical or (), strict=False):
            self._lexical[query] = weights
            self._lexical.move_to_end(query)
        while len(self._lexical) > LEXICAL_MEMORY:
            self._lexical.popitem(last=False)
        return encoded.dense

    async def sparse(self, req: SearchDocsRequest, mode: str) -> dict[int, float] | None:
        """The query's learned sparse weights when a hybrid search fuses them (``None``:
        it does not); embedded again only when the vector came without them."""
        if not self.lexical or mode != "hybrid" or lexical_weight(req, self.settings) <= 0:
            return None
        weights = self._lexical.get(req.query)
        if weights is None:
            with stage("embed"):
                await self.embed([req.query])
            weights = self._lexical.get(req.query)
        return weights or None


def lexical_weight(req: SearchDocsRequest, settings: GatewaySettings) -> float:
    """The weight of the learned sparse list in a hybrid search's fusion: the request's, or
    ``search.lexical_weight``."""
    if req.weights is not None and req.weights.lexical is not None:
        return req.weights.lexical
    return settings.search.lexical_weight


def _as_list(vector: Any) -> list[float] | None:
    if vector is None:
        return None
    if isinstance(vector, np.ndarray) and vector.ndim == 1:
        # The same Python floats as float(x) of each element, in one call (3 against 14 µs).
        return vector.tolist()
    return [float(x) for x in vector]
