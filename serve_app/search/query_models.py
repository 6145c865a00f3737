"""A search query's vectors during a change of embedding model (docs/operations.md,
"Changing the embedding model"): the primary model's, which the search has already, plus
one per other served model, keyed by model tag. The Retriever takes the one of the model of
the version the search reads (deployments/vector_store/model_choice.py). With one model
served nothing extra is embedded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from deployments.errors import BackendUnavailable
from serve_app.timing import stage


class QueryModels:
    """Embeds a query with the other served models.

    Args:
        embedder: the gateway's embedder (``model=`` names a model by tag).
        primary: the primary model's tag; ``others``: the other served models' tags.
        deadline_s: how long one embedding may take (``search.embed_deadline_s``).
    """

    def __init__(
        self, embedder: Any, primary: str, others: Sequence[str], deadline_s: float
    ) -> None:
        self.embedder = embedder
        self.primary = primary
        self.others = [tag for tag in others if tag != primary]
        self.deadline_s = deadline_s

    async def vectors(
        self, query: str, primary_vector: Sequence[float] | None
    ) -> dict[str, list[float]] | None:
        """``tag → vector`` of every served model, the primary's first; ``None`` with one
        model served (or no vector to search with).

        Raises:
            BackendUnavailable: an embedding failed or did not come in time.
        """
        if not self.others or primary_vector is None:
            return None
        with stage("embed"):
            try:
                others = await asyncio.wait_for(
                    asyncio.gather(
                        *(self.embedder.embed([query], "query", model=tag) for tag in self.others)
                    ),
                    self.deadline_s,
                )
            except TimeoutError:
                raise BackendUnavailable(
                    "embedder", f"no query embedding within {self.deadline_s:g} s"
                ) from None
        out = {self.primary: [float(x) for x in primary_vector]}
        for tag, vectors in zip(self.others, others, strict=True):
            out[tag] = [float(x) for x in vectors[0]]
        return out
