"""Issue 33, item 7: one search reads one version of its team's collection across a reindex
swap. ``RetrieverDeployment`` over a stand-in store whose searches resolve the alias when each
call arrives (as Milvus does), with the swap landing between two calls of one search: before
the fix, a search fused lists of the old and the new version (documents neither gives)."""

from __future__ import annotations

import threading

from deployments.config import MilvusSettings
from deployments.protocols import SearchFilter, SearchHit
from deployments.vector_store.deployment import RetrieverDeployment
from tests.unit.deployments.vector_store.memindex.test_hot_index import TEAM, FakeSource, chunk

OLD = {f"{TEAM}-c{i}" for i in range(10)}
NEW = {f"{TEAM}-c{i}" for i in range(100, 110)}
FLT = SearchFilter(team_id=TEAM)
VECTOR = [1.0, 0.0, 0.0, 0.0]


class AliasStore:
    """``MilvusStore.search`` over ``FakeSource``: by physical name when given, else the
    collection the alias names when the call is served. ``before`` runs first (per mode)."""

    def __init__(self, source: FakeSource) -> None:
        self.versions = source
        self.before: dict[str, object] = {}
        self.searched: list[tuple[str, str]] = []  # (mode, collection)

    def search(
        self, query_text, query_vector, flt, limit, mode="dense", query_lexical=None, **kw
    ) -> list[SearchHit]:
        hook = self.before.get(mode)
        if callable(hook):
            hook()
        name = kw.get("physical") or self.versions.live_physical(flt.team_id)
        self.searched.append((mode, name))
        rows = self.versions.collections[name].values()
        return [SearchHit(chunk=r, score=1.0) for r in rows if r.team_id == flt.team_id][:limit]


def retriever(source: FakeSource, memory: bool) -> RetrieverDeployment:
    settings = MilvusSettings()
    settings = settings.model_copy(
        update={"memory_index": settings.memory_index.model_copy(update={"enabled": memory})}
    )
    return RetrieverDeployment(settings, 4, store=AliasStore(source))  # type: ignore[arg-type]


def versions_read(found: dict[str, list[SearchHit]]) -> list[str]:
    ids = {h.chunk.chunk_id for hits in found.values() for h in hits}
    return [name for name, rows in (("old", OLD), ("new", NEW)) if ids & rows]


def source_with_new_version() -> tuple[FakeSource, str]:
    source = FakeSource()
    source.write([chunk(i) for i in range(10)])
    return source, source.build([chunk(i) for i in range(100, 110)], version=2)


async def test_a_swap_between_the_dense_and_the_bm25_call_of_a_milvus_search():
    """The Milvus path runs each method as its own call; the swap lands after the dense call
    read the alias and before the BM25 call does."""
    source, physical = source_with_new_version()
    ret = retriever(source, memory=False)
    dense_read = threading.Event()
    store = ret.store
    assert isinstance(store, AliasStore)

    def switch_once_dense_read() -> None:
        dense_read.wait(5)
        source.switch(physical)

    store.before = {"dense": None, "bm25": switch_once_dense_read}
    original = store.search

    def search(*args, **kw):
        try:
            return original(*args, **kw)
        finally:
            if (args[4] if len(args) > 4 else kw.get("mode")) == "dense":
                dense_read.set()

    store.search = search  # type: ignore[method-assign]
    found = await ret.candidates("milvus", VECTOR, FLT, 100, ("dense", "bm25"), "r1")
    assert versions_read(found) == ["old"], store.searched
    # The next search reads the new version, all of it.
    store.before = {}
    found = await ret.candidates("milvus", VECTOR, FLT, 100, ("dense", "bm25"), "r2")
    assert versions_read(found) == ["new"]


async def test_the_second_call_of_a_search_reads_the_version_its_first_call_read():
    """BM25 first (from memory, old version), then the swap, a reload caused by another
    search, then the same search's dense call: it must not come from the new copy."""
    source, physical = source_with_new_version()
    ret = retriever(source, memory=True)
    assert ret.hot is not None and ret.hot.wait_loaded(TEAM, timeout_s=10)
    first = await ret.candidates("milvus", None, FLT, 100, ("bm25",), "r1")
    source.switch(physical)
    await ret.candidates("milvus", VECTOR, FLT, 100, ("dense", "bm25"), "r2")  # notices it
    assert ret.hot.wait_loaded(TEAM, timeout_s=10)
    second = await ret.candidates("milvus", VECTOR, FLT, 100, ("dense",), "r1")
    assert versions_read(first | second) == ["old"]
    assert versions_read(await ret.candidates("x", VECTOR, FLT, 100, ("dense",), "r3")) == ["new"]
    ret.hot.close()


async def test_learned_sparse_weights_are_searched_in_the_version_memory_answered():
    """The alias was pointed at the new version and its swap token is not recorded yet:
    memory (still in sync) answers the old version, so must the lexical call in Milvus."""
    source, physical = source_with_new_version()
    ret = retriever(source, memory=True)
    assert ret.hot is not None and ret.hot.wait_loaded(TEAM, timeout_s=10)
    source.alias[source.collection_for(TEAM)] = physical  # alter_alias; record_swap pending
    found = await ret.candidates(
        "milvus", VECTOR, FLT, 100, ("dense", "bm25", "lexical"), "r1", {1: 0.5}
    )
    assert set(found) == {"dense", "bm25", "lexical"}
    assert versions_read(found) == ["old"]
    ret.hot.close()
