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
from deployments.protocols import SearchFilter
from deployments.vector_store.deployment import RetrieverDeployment
from deployments.vector_store.store import MilvusStore
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


def test_reindex_outdated_moves_every_team_of_another_model_to_the_configured_one(
    settings, tmp_path, capsys
):
    """The upgrade path (docs/operations.md "Upgrading to the int8 default"): a team
    indexed with torch fp32 is refused by a gateway serving int8 until
    ``python -m batch_ingest.reindex --outdated`` (scripts/start.sh runs it) has moved it;
    a team already on the configured model is left alone."""
    from batch_ingest.chunks import chunk_builder
    from batch_ingest.documents import SourceDocument
    from batch_ingest.pipeline import IngestPipeline
    from batch_ingest.reindex.cli import reindex_outdated
    from batch_ingest.source_store import SourceStore
    from deployments.config import EmbedderSettings
    from deployments.models.embedder_models import LocalModels

    milvus = settings.milvus.model_copy(update={"collection": f"mo_{uuid.uuid4().hex[:10]}"})
    state = settings.state.model_copy(update={"url": f"sqlite:///{tmp_path}/state.db"})
    fp32 = EmbedderSettings(backend="transformers")
    int8 = EmbedderSettings()  # the default: ONNX int8
    old_team, new_team = f"old_{uuid.uuid4().hex[:6]}", f"new_{uuid.uuid4().hex[:6]}"
    sources = SourceStore(state.url)

    def write(team: str, model: EmbedderSettings) -> RetrieverDeployment:
        store = RetrieverDeployment(milvus, 384, models={model.embed_model_tag: 384})
        embedder = LocalModels(model)
        embedder.models.start()
        pipeline = IngestPipeline(
            embedder=embedder,
            store=store,
            graph=None,
            chunker=chunk_builder(settings.chunking, model).chunker,
            embed_model=model.embed_model_tag,
            sources=sources,
        )
        docs = [
            SourceDocument(team_id=team, doc_id=f"d{i}", title="t", text=f"note {i} on milvus")
            for i in range(3)
        ]
        asyncio.run(pipeline.ingest(docs))
        return store

    old, new = write(old_team, fp32), write(new_team, int8)
    gateway = RetrieverDeployment(milvus, 384, models={INT8: 384})
    try:
        with pytest.raises(BackendUnavailable):
            asyncio.run(gateway.count(old_team))
        job_settings = settings.model_copy(
            update={"milvus": milvus, "state": state, "embedder": int8}
        )
        assert reindex_outdated(job_settings, "local") == 0
        printed = capsys.readouterr().out
        assert f"{old_team}: {FP32} -> {INT8}" in printed and new_team not in printed
        assert asyncio.run(gateway.count(old_team)) == asyncio.run(old.count(old_team)) > 0
        assert gateway.store.live_model(old_team) == INT8
        assert reindex_outdated(job_settings, "local") == 0
        assert "nothing to reindex" in capsys.readouterr().out
    finally:
        old.store.drop()
        close(old, new, gateway)
