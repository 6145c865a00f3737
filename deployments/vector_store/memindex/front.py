"""``MemoryFront``: the part of a ``candidates`` call the in-memory index answers, shared by
the process that holds it (a Retriever replica, or an Ingress replica that holds it itself:
``milvus.memory_index.serve_from``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from deployments.protocols import SearchFilter, SearchHit
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.hot import HotIndex

if TYPE_CHECKING:
    from deployments.config import MilvusSettings
    from deployments.vector_store.memindex.copies import RowSource

# What memory holds: dense vectors and BM25 postings (learned sparse weights stay in Milvus).
MEMORY_METHODS = frozenset({"dense", "bm25"})


def hot_index(
    settings: MilvusSettings, source: RowSource, busy: Callable[[], bool] | None = None
) -> HotIndex:
    """The in-memory index of ``settings.memory_index`` over ``source`` (the store's versions);
    ``busy``: whether the process serves other requests now (a dense scan then uses one
    thread)."""
    mem = settings.memory_index
    return HotIndex(
        source,
        metric=settings.metric_type,
        max_mb=mem.max_mb,
        lookback_s=mem.lookback_s,
        generation_trust_s=mem.generation_trust_s,
        scan_threads=mem.scan_threads,
        scan_busy=busy,
        int8_first_pass=mem.int8_first_pass,
        k1=settings.bm25_k1,
        b=settings.bm25_b,
    )


class MemoryFront:
    """Answers the memory methods of a search from ``hot`` when its team is loaded and in sync.

    ``answer`` returns each memory method's candidates, or ``None`` (the team is not loaded,
    out of sync, or of another version than this search reads): the caller asks Milvus.
    """

    def __init__(self, hot: HotIndex) -> None:
        self.hot = hot

    async def answer(
        self,
        query_text: str,
        query_vector: list[float] | None,
        flt: SearchFilter,
        limit: int,
        methods: tuple[str, ...],
        read_id: str = "",
        generation: int | None = None,
    ) -> dict[str, list[SearchHit]] | None:
        """``generation``: the team's index generation, from a read that began after this
        search arrived (``HotIndex.candidates``); ``None`` when the caller has none."""
        in_memory = tuple(m for m in methods if m in MEMORY_METHODS)
        if not in_memory:
            return None
        args = (query_text, query_vector, compile_filter(flt), limit, in_memory, read_id)
        # A search already checked, or one whose generation shows nothing was written since
        # the last check, needs no I/O: answer it on the loop.
        found = self.hot.synced_candidates(*args, generation=generation)
        if found is None:  # the change-log check reads Milvus: in a thread
            found = await asyncio.to_thread(self.hot.candidates, *args, generation=generation)
        return found
