"""Which query vector a search uses while two embedding models are served (a change of model,
docs/operations.md "Changing the embedding model").

The ingress embeds the query with every model served and sends the vectors keyed by model tag;
the Retriever pins the physical version the search reads (``memindex.pins``) and takes the
vector of that version's model (``CollectionShapes.model_of``), so a vector is never matched
against another model's collection, whichever side of the alias switch the search falls on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deployments.errors import BackendUnavailable

# Query vectors of one text, by model tag, the primary model's first.
QueryVectors = Mapping[str, Sequence[float]]


def vector_for(vectors: QueryVectors, model: str | None, where: str) -> list[float]:
    """The vector of ``model``, the model of collection ``where``; with ``model`` ``None``
    (a version that never noted its model and holds no row yet: nothing to match) the
    primary's.

    Raises:
        BackendUnavailable: no vector of that model (the embedder serves other models than
            the version was built with: finish or undo the change of model).
    """
    if not vectors:
        raise BackendUnavailable("embedder", "no query vector given")
    if model is None:
        return [float(x) for x in next(iter(vectors.values()))]
    vector = vectors.get(model)
    if vector is None:
        raise BackendUnavailable(
            "embedder",
            f"{where} holds vectors of {model}; the query was embedded with "
            f"{', '.join(vectors)} only",
            hint="serve that model too (embedder or embedder_next) or reindex the team",
        )
    return [float(x) for x in vector]
