"""The Retriever's Serve shell: ``RetrieverDeployment`` over ``MilvusStore`` (store.py) and its
in-memory index of hot teams (memindex/)."""

from __future__ import annotations

import asyncio
import logging
import pickle
import uuid
from collections.abc import Mapping
from typing import Any

from deployments.config import MilvusSettings
from deployments.health import BackendHealth
from deployments.protocols import (
    ChunkRecord,
    SearchFilter,
    SearchHit,
)
from deployments.serve_log import route_logs_to_serve
from deployments.vector_store.memindex.front import MemoryFront, hot_index
from deployments.vector_store.memindex.pins import VersionPins
from deployments.vector_store.model_choice import QueryVectors, vector_for
from deployments.vector_store.store import MilvusStore

logger = logging.getLogger(__name__)


def deployment_options(settings: MilvusSettings) -> dict[str, Any]:
    """Serve options of ``RetrieverDeployment`` (its work is I/O and a millisecond of
    numpy per search: a tenth of a CPU, many requests in flight)."""
    return {"name": "Retriever", "max_ongoing_requests": 64, "ray_actor_options": {"num_cpus": 0.1}}


def build_store(
    settings: MilvusSettings,
    dim: int,
    lexical: bool = False,
    models: Mapping[str, int] | None = None,
) -> MilvusStore:
    """The store of a process serving ``models`` (``tag → vector size``, the primary first)."""
    tags = list(models or {})
    return MilvusStore(
        settings,
        dim=dim,
        lexical=lexical,
        embed_model=tags[0] if tags else "",
        dims=tuple((models or {}).values()),
        served=tuple(tags),
    )


class RetrieverDeployment:
    """Serve shell over ``MilvusStore`` and its in-memory ``HotIndex`` (when enabled): a
    search is answered from memory when the team is loaded and in sync, else by Milvus.
    Every blocking call runs in a thread.

    Args:
        settings, dim, lexical: the store's (``MilvusStore``).
        store: the store itself (unit tests pass a stand-in); built from the above if unset.
        models: ``model tag → vector size`` of the models served, the primary first (it
            makes ``dim``-d vectors): its tag is noted on the collections the store creates,
            each size is one a collection may have, and a team's collection of a model not
            among them is refused, never searched or written with these models' vectors.
        memory_index: hold the in-memory index here (when ``settings.memory_index`` enables
            it); ``False`` when the Ingress replicas hold it (``serve_from``): this replica
            then answers from Milvus what their memory cannot.
    """

    def __init__(
        self,
        settings: MilvusSettings,
        dim: int,
        lexical: bool = False,
        *,
        store: MilvusStore | None = None,
        models: Mapping[str, int] | None = None,
        memory_index: bool = True,
    ) -> None:
        route_logs_to_serve()
        self.store = store or build_store(settings, dim, lexical, models)
        enabled = memory_index and settings.memory_index.enabled
        self.hot = hot_index(settings, self.store.versions) if enabled else None
        self.memory = MemoryFront(self.hot) if self.hot is not None else None
        # The version each search reads (shared with the in-memory index when it is on).
        self.pins = self.hot.pins if self.hot is not None else VersionPins(self.store.versions)
        self.health = BackendHealth("milvus", self.status)

    async def check_health(self) -> None:
        """Serve's health check: fails the replica after Milvus failed several in a row."""
        await self.health.check()

    async def upsert(self, chunks: list[ChunkRecord]) -> int:
        return await asyncio.to_thread(self.store.upsert, chunks)

    async def delete_chunks(self, team_id: str, chunk_ids: list[str]) -> int:
        return await asyncio.to_thread(self.store.delete_chunks, team_id, chunk_ids)

    async def lookup(self, team_id: str, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        return await asyncio.to_thread(self.store.lookup, team_id, chunk_ids)

    async def stored_chunks(self, team_id: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        return await asyncio.to_thread(self.store.stored_chunks, team_id, chunk_ids)

    async def delete_stale_chunks(
        self, team_id: str, doc_type: str, doc_id: str, keep: list[str]
    ) -> int:
        return await asyncio.to_thread(
            self.store.delete_stale_chunks, team_id, doc_type, doc_id, keep
        )

    async def get_chunks(self, team_id: str, doc_type: str, doc_id: str) -> list[ChunkRecord]:
        return await asyncio.to_thread(self.store.get_chunks, team_id, doc_type, doc_id)

    async def fingerprints(
        self, docs: list[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], list[tuple[str, str, str]]]:
        return await asyncio.to_thread(self.store.fingerprints, docs)

    async def candidates(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str = "",
        query_lexical: Mapping[int, float] | None = None,
        query_vectors: QueryVectors | None = None,
        pinned: str | None = None,
        generation: int | None = None,
    ) -> dict[str, list[SearchHit]]:
        """Each method's candidates, all of one physical version of the team's collection:
        from memory when the team is loaded, in sync and of the version this search
        (``read_id``) reads; else from Milvus, by that version's physical name
        (``VersionPins``), never from whatever the alias names when each call arrives.

        ``query_vectors`` (during a change of model: the query's vector per model tag) is
        used instead of ``query_vector``: the version this search reads is pinned first, and
        the vector of that version's model is searched (``model_choice``). ``pinned``: the
        version an earlier call of this search read from the caller's own memory (an
        Ingress holding the index): this call reads that one too. ``generation``: the
        team's index generation, read after the search arrived (``HotIndex.fresh``)."""
        if pinned and read_id:
            self.pins.pin(flt.team_id, read_id, pinned)
        strict = False
        if query_vectors is not None and "dense" in methods:
            read_id = read_id or uuid.uuid4().hex  # one version for every method of this call
            query_vector = await self._vector_of_version(flt.team_id, read_id, query_vectors)
            strict = True
        # The in-memory index holds dense vectors and BM25 postings; the learned sparse
        # weights (``lexical``) are always searched in Milvus, in the version memory answered.
        found: dict[str, list[SearchHit]] | None = None
        if self.memory is not None:
            found = await self.memory.answer(
                query_text, query_vector, flt, limit, methods, read_id, generation
            )
        rest = tuple(m for m in methods if found is None or m not in found)
        if not rest:
            return found or {}
        physical = self.pins.get(flt.team_id, read_id) or await asyncio.to_thread(
            self.pins.resolve, flt.team_id, read_id
        )
        more = await self._search(
            query_text, query_vector, flt, limit, rest, query_lexical, physical, strict
        )
        return (found or {}) | more

    async def candidates_packed(self, *args: Any, **kwargs: Any) -> bytes:
        """``candidates`` as one standard pickle: the ingress's handle unpacks it
        (serve_app/handles.py, ``StoreProxy``). A search returns a few hundred hits with
        their chunks; Serve's own serializer (cloudpickle) runs Python code for each of
        those objects on both sides, the standard pickler none (bench/README.md, "Search
        plumbing": ~12 % of the Retriever's and ~9 % of the Ingress's CPU)."""
        return pickle.dumps(await self.candidates(*args, **kwargs), pickle.HIGHEST_PROTOCOL)

    async def _vector_of_version(
        self, team_id: str, read_id: str, vectors: QueryVectors
    ) -> list[float]:
        """Pin the version search ``read_id`` reads; the query vector of its model."""
        physical = self.pins.get(team_id, read_id) or await asyncio.to_thread(
            self.pins.resolve, team_id, read_id
        )
        if physical is None:  # no collection: nothing to match
            return vector_for(vectors, None, f"team {team_id}")
        model = await asyncio.to_thread(self.store.shapes.model_of, physical)
        return vector_for(vectors, model, physical)

    async def _search(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        methods: tuple[str, ...],
        query_lexical: Mapping[int, float] | None = None,
        physical: str | None = None,
        strict: bool = False,
    ) -> dict[str, list[SearchHit]]:
        """The single-method searches in Milvus, run concurrently (the ingress fuses), all in
        ``physical`` when given (only there when ``strict``)."""
        results = await asyncio.gather(
            *(
                asyncio.to_thread(
                    self.store.search,
                    query_text,
                    query_vector,
                    flt,
                    limit,
                    m,
                    query_lexical,
                    physical=physical,
                    strict=strict,
                )
                for m in methods
            )
        )
        return dict(zip(methods, results, strict=True))

    async def embed_model(self, team_id: str) -> str | None:
        """The tag of the model of the team's live version (``None``: no collection yet, or
        an empty one that never noted it): what a write of the team must be embedded with."""
        return await asyncio.to_thread(self.store.live_model, team_id)

    async def count(self, team_id: str) -> int:
        return await asyncio.to_thread(self.store.count, team_id)

    async def flush(self, team_id: str | None = None) -> None:
        await asyncio.to_thread(self.store.flush, team_id)

    async def status(self) -> dict[str, Any]:
        memory = self.hot.status() if self.hot is not None else {"enabled": False}
        try:
            return {**await asyncio.to_thread(self.store.ping), "memory_index": memory}
        except Exception as exc:
            return {"ready": False, "uri": self.store.settings.uri, "error": str(exc)}
