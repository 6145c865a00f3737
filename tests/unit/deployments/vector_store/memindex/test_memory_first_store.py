"""Issue 37: the in-memory index held by the Ingress replica (``MemoryFirstStore``): a search
of a loaded team makes no call to the Retriever; anything memory cannot answer goes there,
and one search still reads one version of its team's collection across its calls."""

from __future__ import annotations

from typing import Any

from deployments.config import MilvusSettings
from deployments.protocols import SearchHit
from deployments.vector_store.deployment import RetrieverDeployment
from deployments.vector_store.memindex.front import MemoryFront, hot_index
from serve_app.handles import MemoryFirstStore
from serve_app.settings import GatewaySettings
from tests.unit.deployments.vector_store.memindex.test_hot_index import TEAM
from tests.unit.deployments.vector_store.test_one_version_per_search import (
    FLT,
    VECTOR,
    AliasStore,
    source_with_new_version,
    versions_read,
)


class CountingRetriever:
    """The Retriever's handle as the Ingress sees it: a ``RetrieverDeployment`` without its
    own memory index (``serve_from: ingress``), each call recorded."""

    def __init__(self, source: Any) -> None:
        self.deployment = RetrieverDeployment(
            MilvusSettings(),
            4,
            store=AliasStore(source),  # type: ignore[arg-type]
            memory_index=False,
        )
        self.calls: list[tuple[tuple[str, ...], str, dict[str, Any]]] = []

    async def candidates(self, *args: Any, **kwargs: Any) -> dict[str, list[SearchHit]]:
        self.calls.append((args[4], args[5], kwargs))
        if "query_vectors" in kwargs:  # a change of model: not this stand-in's business
            return {}
        return await self.deployment.candidates(*args, **kwargs)

    async def status(self) -> dict[str, Any]:
        return {"ready": True, "memory_index": {"enabled": False}}


def memory_first(source: Any) -> tuple[MemoryFirstStore, CountingRetriever]:
    remote = CountingRetriever(source)
    store = MemoryFirstStore(remote, MemoryFront(hot_index(MilvusSettings(), source)))  # type: ignore[arg-type]
    return store, remote


async def test_a_loaded_team_is_searched_without_a_call_to_the_retriever():
    source, _ = source_with_new_version()
    store, remote = memory_first(source)
    # Not loaded yet: the Retriever answers (Milvus), and the load starts here.
    found = await store.candidates("milvus", VECTOR, FLT, 100, ("dense", "bm25"), "r1")
    assert versions_read(found) == ["old"] and len(remote.calls) == 1
    assert store.memory.hot.wait_loaded(TEAM, timeout_s=10)
    found = await store.candidates("milvus", VECTOR, FLT, 100, ("dense", "bm25"), "r2")
    assert set(found) == {"dense", "bm25"} and versions_read(found) == ["old"]
    assert len(remote.calls) == 1, "a loaded team's search went to the Retriever"
    status = await store.status()
    assert status["memory_index"]["held_by"] == "ingress"
    assert status["memory_index"]["teams"] == 1 and status["ready"] is True
    store.close()


async def test_what_memory_does_not_hold_goes_to_the_retriever():
    source, _ = source_with_new_version()
    store, remote = memory_first(source)
    assert store.memory.hot.wait_loaded(TEAM, timeout_s=10)
    await store.candidates(
        "milvus", VECTOR, FLT, 10, ("dense", "bm25", "lexical"), "r1", query_lexical={1: 0.5}
    )
    await store.candidates("milvus", VECTOR, FLT, 10, ("dense",), "r2", query_vectors={"m": VECTOR})
    # Positionally too, as the graph boost passes the learned sparse weights.
    await store.candidates("milvus", VECTOR, FLT, 10, ("dense", "lexical"), "r3", {1: 0.5})
    assert [c[0] for c in remote.calls] == [
        ("dense", "bm25", "lexical"),
        ("dense",),
        ("dense", "lexical"),
    ]
    assert remote.calls[0][2] == {"query_lexical": {1: 0.5}}
    store.close()


async def test_a_later_call_of_a_search_reads_the_version_its_memory_call_read():
    """BM25 from this replica's memory (old version), then a swap and a reload; the same
    search's dense call cannot come from the new copy: the Retriever reads the old version
    by name."""
    source, physical = source_with_new_version()
    store, remote = memory_first(source)
    assert store.memory.hot.wait_loaded(TEAM, timeout_s=10)
    first = await store.candidates("milvus", None, FLT, 100, ("bm25",), "r1")
    assert not remote.calls
    source.switch(physical)
    await store.candidates("milvus", VECTOR, FLT, 100, ("dense", "bm25"), "r2")  # notices the swap
    assert store.memory.hot.wait_loaded(TEAM, timeout_s=10)
    second = await store.candidates("milvus", VECTOR, FLT, 100, ("dense",), "r1")
    assert versions_read(first) == ["old"] and versions_read(second) == ["old"]
    assert remote.calls[-1][2].get("pinned") == f"{source.collection_for(TEAM)}__v1"
    fresh = await store.candidates("milvus", VECTOR, FLT, 100, ("dense",), "r3")
    assert versions_read(fresh) == ["new"]
    store.close()


async def test_a_search_whose_first_call_went_to_the_retriever_stays_there():
    source, _ = source_with_new_version()
    store, remote = memory_first(source)
    await store.candidates("milvus", None, FLT, 100, ("bm25",), "r1")  # not loaded: remote
    assert store.memory.hot.wait_loaded(TEAM, timeout_s=10)
    await store.candidates("milvus", VECTOR, FLT, 100, ("dense",), "r1")
    assert [c[1] for c in remote.calls] == ["r1", "r1"]
    store.close()


async def test_the_generation_reaches_whichever_index_answers():
    """The team's index generation (read by the Ingress for the semantic cache) reaches the
    Retriever when memory cannot answer, and memory's own check when it can."""
    source, _ = source_with_new_version()
    store, remote = memory_first(source)
    await store.candidates("milvus", None, FLT, 100, ("bm25",), "r1", generation=4)
    assert remote.calls[-1][2].get("generation") == 4
    assert store.memory.hot.wait_loaded(TEAM, timeout_s=10)
    store.memory.hot.generation_trust_s = 60.0
    await store.candidates("milvus", None, FLT, 100, ("bm25",), "r2", generation=5)
    await store.candidates("milvus", None, FLT, 100, ("bm25",), "r3", generation=5)
    assert len(remote.calls) == 1
    assert store.memory.hot.stats["generation_checks"] == 1
    store.close()


def test_auto_holds_the_index_in_the_ingress_unless_the_embedder_makes_sparse_weights():
    assert GatewaySettings().memory_index_in_ingress is True
    lexical = GatewaySettings(embedder={"backend": "flag_m3", "model_path": "/models/bge-m3"})
    assert lexical.memory_index_in_ingress is False
    forced = GatewaySettings(
        embedder={"backend": "flag_m3", "model_path": "/models/bge-m3"},
        milvus={"memory_index": {"serve_from": "ingress"}},
    )
    assert forced.memory_index_in_ingress is True
    assert (
        GatewaySettings(
            milvus={"memory_index": {"serve_from": "retriever"}}
        ).memory_index_in_ingress
        is False
    )
    assert (
        GatewaySettings(milvus={"memory_index": {"enabled": False}}).memory_index_in_ingress
        is False
    )
