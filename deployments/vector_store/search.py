"""One search method's top-k from one of a team's collections in Milvus: ``CollectionSearch``.
The store (store.py) checks the request and opens the team's collection; this asks Milvus,
in the physical version the search was pinned to when it has one (so that every call of one
search reads one version across a reindex swap, memindex/pins.py), else in the alias: the
tenancy filter as an expression over the collection's own fields (with or without the ACL
fields), each method's parameters, and the answer as hits scored higher-is-better. Milvus's
own fusion (baseline.py) builds its requests from the same parts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import SearchHit
from deployments.vector_store.client import MilvusConnection
from deployments.vector_store.filter import CompiledFilter
from deployments.vector_store.rows import SEARCH_METHODS, output_fields, row_to_chunk
from deployments.vector_store.shapes import CollectionShapes

logger = logging.getLogger(__name__)
BM25_PARAMS: dict[str, Any] = {"metric_type": "BM25"}


def check_search(
    mode: str, query_vector: list[float] | None, query_lexical: Mapping[int, float] | None
) -> None:
    """Refuse an unknown ``mode``, or one without the query it searches with
    (``InvalidInput``)."""
    if mode not in SEARCH_METHODS:
        raise InvalidInput(f"mode must be one of {', '.join(SEARCH_METHODS)}, got {mode!r}")
    if mode == "dense" and query_vector is None:
        raise InvalidInput("mode 'dense' needs a query vector")
    if mode == "lexical" and query_lexical is None:
        raise InvalidInput("mode 'lexical' needs the query's learned sparse weights")


def dense_params(settings: MilvusSettings, limit: int) -> dict[str, Any]:
    """The search parameters of the dense field for a top ``limit``."""
    return {"metric_type": settings.metric_type, "params": {"ef": max(64, limit)}}


class CollectionSearch:
    """Dense, BM25 and learned sparse searches of one collection.

    Args:
        conn, settings: the store's.
        shapes: the store's; whether a collection has the ACL and ``lexical`` fields.
        load: loads a physical version once per connection
            (``TeamCollections.load_physical``).
    """

    def __init__(
        self,
        conn: MilvusConnection,
        settings: MilvusSettings,
        shapes: CollectionShapes,
        *,
        load: Callable[[str], None],
    ) -> None:
        self.conn = conn
        self.settings = settings
        self.shapes = shapes
        self._load = load

    def search(
        self,
        name: str,
        query_text: str,
        query_vector: list[float] | None,
        compiled: CompiledFilter,
        limit: int,
        mode: str,
        query_lexical: Mapping[int, float] | None,
        *,
        physical: str | None = None,
        strict: bool = False,
    ) -> list[SearchHit]:
        """Top ``limit`` of ``mode`` inside ``compiled`` in the team's collection ``name``
        (its alias), or in ``physical``.

        ``physical``: search this version of the team's collection (by its physical name)
        rather than whatever the alias names when the call arrives, so that the calls of one
        search read one version across a reindex swap (``memindex.pins``). If that version
        is gone (dropped after the swap), the alias answers, unless ``strict`` (the query
        vector was chosen for that version's model: the alias may name another model's).
        """
        args = (query_text, query_vector, compiled, limit, mode, query_lexical)
        if physical is not None:
            try:
                self._load(physical)
                return self._search_in(physical, *args)
            except BackendUnavailable as exc:
                if strict:
                    raise
                logger.info("search of %s failed (%s); searching the alias", physical, exc)
        return self._search_in(name, *args)

    def _search_in(
        self,
        name: str,
        query_text: str,
        query_vector: list[float] | None,
        compiled: CompiledFilter,
        limit: int,
        mode: str,
        query_lexical: Mapping[int, float] | None,
    ) -> list[SearchHit]:
        acl = self.shapes.has_acl(name)
        expr = compiled.milvus_expr(acl=acl)
        data: list[Any]
        if mode == "dense":
            data, field, params = [query_vector], "dense", dense_params(self.settings, limit)
        elif mode == "bm25":
            data, field, params = [query_text], "sparse", BM25_PARAMS
        else:
            weights = {int(t): float(w) for t, w in (query_lexical or {}).items() if w > 0}
            if not weights or not self.shapes.has_lexical(name):
                return []
            data, field, params = [weights], "lexical", {"metric_type": "IP"}
        result = self.conn.call(
            "search",
            "search",
            name,
            data=data,
            anns_field=field,
            filter=expr,
            limit=limit,
            search_params=params,
            output_fields=output_fields(acl=acl),
        )
        return hits_of(result, mode)


def hits_of(result: Any, mode: str) -> list[SearchHit]:
    """A Milvus search answer as hits, scored higher-is-better."""
    hits = []
    for hit in result[0] if result else []:
        entity = hit.get("entity", hit)
        raw = float(hit["distance"])
        # Milvus Lite returns BM25 scores negated; report them higher-is-better.
        score = abs(raw) if mode == "bm25" else raw
        hits.append(SearchHit(chunk=row_to_chunk(entity), score=score, scores={mode: score}))
    return hits
