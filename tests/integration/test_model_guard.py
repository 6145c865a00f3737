"""A team's collection holds one model's vectors; a gateway serving other models refuses it
(a clear 503 naming both) instead of comparing vectors across models, on every path: a search
from memory or from Milvus, a lookup, a write. The case this guards: an int8 export of a
model has its own tag (its vectors are close to the fp32 ones, not equal), so an upgrade
that changes ``embedder.quantize`` without a reindex must not mix the two in one collection.
Against the real Milvus Lite server."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from deployments.errors import BackendUnavailable
from deployments.milvus_store import MilvusStore
from deployments.protocols import SearchFilter
from deployments.retriever import RetrieverDeployment
from tests.integration.test_milvus_store import chunk, vec

pytestmark = pytest.mark.integration

FP32, INT8 = "all-MiniLM-L6-v2@v1", "all-MiniLM-L6-v2@v1+int8"


@pytest.fixture
def milvus(settings):
    cfg = settings.milvus.model_copy(update={"collection": f"mg_{uuid.uuid4().hex[:10]}"})
    yield cfg
    store = MilvusStore(cfg, dim=384)
    store.start()
    store.drop()
    store.close()


def tagged(team: str, doc: str, model: str):
    return dataclasses.replace(chunk(team, doc, text=f"{doc} about milvus"), embed_model=model)


def close(*retrievers: RetrieverDeployment) -> None:
    for r in retrievers:
        if r.hot is not None:
            r.hot.close()
        r.store.close()


def test_a_collection_of_a_model_not_served_is_refused_on_every_path(milvus):
    team = f"team_{uuid.uuid4().hex[:8]}"
    flt = SearchFilter(team_id=team)
    old = RetrieverDeployment(milvus, 384, models={FP32: 384})
    new = RetrieverDeployment(milvus, 384, models={INT8: 384})
    both = RetrieverDeployment(milvus, 384, models={INT8: 384, FP32: 384})
    try:

        async def run() -> None:
            await old.upsert([tagged(team, "d1", FP32)])
            await old.flush(team)
            assert [
                h.chunk.doc_id
                for h in (await old.candidates("milvus", vec("q"), flt, 5, ("dense", "bm25")))[
                    "bm25"
                ]
            ] == ["d1"]
            for attempt in (
                new.candidates("milvus", vec("q"), flt, 5, ("dense", "bm25")),
                new.candidates("milvus", vec("q"), flt, 5, ("bm25",)),
                new.lookup(team, [tagged(team, "d1", INT8).chunk_id]),
                new.upsert([tagged(team, "d2", INT8)]),
            ):
                with pytest.raises(BackendUnavailable) as refused:
                    await attempt
                assert FP32 in str(refused.value) and INT8 in str(refused.value)
                assert "reindex" in str(refused.value.hint)
            # Nothing of the refused write reached the collection.
            assert set(await old.lookup(team, [tagged(team, "d2", FP32).chunk_id])) == set()
            # While both are served (a change of model), the team is searched as before.
            found = await both.candidates("milvus", None, flt, 5, ("bm25",))
            assert [h.chunk.doc_id for h in found["bm25"]] == ["d1"]

        asyncio.run(run())
        # A reindex job's store (no served models named) reads it to move it.
        mover = MilvusStore(milvus, dim=384)
        mover.start()
        assert list(mover.lookup(team, [tagged(team, "d1", FP32).chunk_id]).values()) == [
            (tagged(team, "d1", FP32).content_hash, FP32)
        ]
        mover.close()
    finally:
        close(old, new, both)
