"""A change of embedding model (issue 33; docs/operations.md "Changing the embedding model"):
which models are served, which one embeds what, and which query vector a search uses. The
end-to-end run against Milvus is tests/integration/test_reindex_model_change.py."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from batch_ingest.chunking import Chunker
from batch_ingest.documents import SourceDocument
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.settings import BatchSettings
from deployments.config import EmbedderSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.models.embedder import EmbedderDeployment
from deployments.models.embedder_models import EmbedderModels
from deployments.models.embedding import SplitEmbedder
from deployments.protocols import Encoded
from deployments.testing.fakes import FakeVectorStore
from deployments.timing import MeanTimes
from deployments.vector_store.model_choice import vector_for
from serve_app.search.query_models import QueryModels

OLD = EmbedderSettings(backend="transformers")
NEW = EmbedderSettings(model_name="tiny-embed", model_version="v1", dim=4)


# --- which query vector a search uses ------------------------------------------------------
def test_the_vector_of_the_versions_model_is_chosen():
    vectors = {"old@v1": [1.0, 0.0, 0.0], "new@v1": [0.5, 0.5]}
    assert vector_for(vectors, "new@v1", "c__v2") == [0.5, 0.5]
    assert vector_for(vectors, "old@v1", "c__v1") == [1.0, 0.0, 0.0]
    # A version that never noted its model and holds no row: the primary's (nothing to match).
    assert vector_for(vectors, None, "c__v3") == [1.0, 0.0, 0.0]


def test_a_version_of_a_model_not_served_is_refused_not_searched():
    with pytest.raises(BackendUnavailable, match="c__v2 holds vectors of other@v9"):
        vector_for({"old@v1": [1.0]}, "other@v9", "c__v2")
    with pytest.raises(BackendUnavailable):
        vector_for({}, "old@v1", "c__v1")


# --- which models are served ---------------------------------------------------------------
def test_settings_name_the_served_models_and_the_one_a_reindex_uses(monkeypatch):
    alone = BatchSettings(embedder=OLD)
    assert alone.embedders == [OLD] and alone.reindex_embedder is OLD
    same = BatchSettings(embedder=OLD, embedder_next=OLD.model_copy())
    assert len(same.embedders) == 1
    both = BatchSettings(embedder=OLD, embedder_next=NEW)
    assert [e.embed_model_tag for e in both.embedders] == ["all-MiniLM-L6-v2@v1", "tiny-embed@v1"]
    assert both.reindex_embedder is both.embedder_next
    monkeypatch.setenv("EMBEDDER_NEXT__MODEL_NAME", "bge-m3")
    monkeypatch.setenv("EMBEDDER_NEXT__MODEL_VERSION", "v2")
    assert BatchSettings().reindex_embedder.embed_model_tag == "bge-m3@v2"


def test_models_are_picked_by_tag():
    models = EmbedderModels(OLD, None, NEW, OLD.model_copy())
    assert models.tags == ["all-MiniLM-L6-v2@v1", "tiny-embed@v1"]
    assert models.core() is models.primary is models.core("all-MiniLM-L6-v2@v1")
    assert models.core("tiny-embed@v1").settings is NEW
    with pytest.raises(InvalidInput, match="'nope@v1' is not served here"):
        models.core("nope@v1")


class StubCore:
    """An ``EmbedderCore`` stand-in whose vectors say which model made them."""

    def __init__(self, settings: EmbedderSettings, value: float) -> None:
        self.settings, self.value = settings, value
        self.batches: list[list[str]] = []

    def encode(self, texts: list[str], kind: str = "passage") -> Encoded:
        self.batches.append(list(texts))
        return Encoded(np.full((len(texts), 2), self.value, dtype=np.float32))


def shell_with_stub_models() -> tuple[EmbedderDeployment, StubCore, StubCore]:
    shell = EmbedderDeployment.__new__(EmbedderDeployment)  # no model load, no batch queue
    shell.models = EmbedderModels(OLD, NEW)
    old, new = StubCore(OLD, 1.0), StubCore(NEW, 2.0)
    shell.models.cores = {OLD.embed_model_tag: old, NEW.embed_model_tag: new}  # type: ignore[dict-item]
    shell.core = shell.models.primary
    shell._timing = MeanTimes()
    return shell, old, new


def test_a_batch_of_two_models_runs_each_model_once_and_keeps_the_order():
    shell, old, new = shell_with_stub_models()
    o, n = OLD.embed_model_tag, NEW.embed_model_tag
    requests = [(0.0, "a", o), (0.0, "b", n), (0.0, "c", o), (0.0, "d", n)]
    parts = asyncio.run(shell._run(requests, "passage"))
    assert [float(p.dense[0][0]) for p in parts] == [1.0, 2.0, 1.0, 2.0]
    assert old.batches == [["a", "c"]] and new.batches == [["b", "d"]]


def test_the_shell_refuses_a_model_it_does_not_serve():
    shell, _, _ = shell_with_stub_models()
    with pytest.raises(InvalidInput, match="not served"):
        asyncio.run(shell.encode(["x"], "query", model="nope@v1"))


# --- which model embeds a query, a write ---------------------------------------------------
class ByModel:
    """An embedder that serves two models; each vector says which one made it."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str, str | None]] = []

    async def embed(self, texts: list[str], kind: str = "passage", *, model: Any = None) -> Any:
        self.calls.append((list(texts), kind, model))
        value = 2.0 if model == NEW.embed_model_tag else 1.0
        return np.full((len(texts), 3), value, dtype=np.float32)


def test_a_query_is_embedded_with_every_served_model_only_during_a_change():
    embedder = ByModel()
    one = QueryModels(embedder, "old@v1", [], 1.0)
    assert asyncio.run(one.vectors("q", [0.1, 0.2, 0.3])) is None
    assert embedder.calls == []
    two = QueryModels(embedder, OLD.embed_model_tag, [NEW.embed_model_tag], 1.0)
    assert asyncio.run(two.vectors("q", None)) is None  # BM25 only: nothing to pick
    vectors = asyncio.run(two.vectors("q", [0.1, 0.2, 0.3]))
    assert vectors == {OLD.embed_model_tag: [0.1, 0.2, 0.3], NEW.embed_model_tag: [2.0] * 3}
    assert list(vectors) == [OLD.embed_model_tag, NEW.embed_model_tag]  # the primary first
    assert embedder.calls == [(["q"], "query", NEW.embed_model_tag)]


def test_the_ingress_sends_another_models_query_to_the_shared_embedder():
    class Local(ByModel):
        core = type("Core", (), {"settings": OLD})()

    local, shared = Local(), ByModel()
    split = SplitEmbedder(queries=local, passages=shared)
    asyncio.run(split.embed(["q"], "query", model=NEW.embed_model_tag))
    asyncio.run(split.embed(["q"], "query", model=OLD.embed_model_tag))
    assert shared.calls == [(["q"], "query", NEW.embed_model_tag)]
    assert local.calls == [(["q"], "query", None)]


class LiveModelStore(FakeVectorStore):
    """A store whose teams' live versions hold the model ``live`` names."""

    def __init__(self, live: dict[str, str]) -> None:
        super().__init__()
        self.live = live

    async def embed_model(self, team_id: str) -> str | None:
        return self.live.get(team_id)


def pipeline_over(store: FakeVectorStore, embedder: ByModel, others: list[str]) -> IngestPipeline:
    return IngestPipeline(
        embedder=embedder,  # type: ignore[arg-type]
        store=store,
        graph=None,
        chunker=Chunker(lambda t: len(t.split()), 64, 8),
        embed_model=OLD.embed_model_tag,
        other_models=others,
    )


def test_a_write_is_embedded_with_the_model_of_its_teams_live_version():
    store = LiveModelStore({"switched": NEW.embed_model_tag, "waiting": OLD.embed_model_tag})
    embedder = ByModel()
    pipeline = pipeline_over(store, embedder, [NEW.embed_model_tag])
    docs = [
        SourceDocument(team_id=team, doc_id=f"d-{team}", title="t", text=f"notes of {team}")
        for team in ("switched", "waiting", "new_team")
    ]
    report = asyncio.run(pipeline.ingest(docs))
    assert not report.failed
    by_team = {c.team_id: c for c in store.rows.values()}
    assert by_team["switched"].embed_model == NEW.embed_model_tag
    assert by_team["switched"].vector == [2.0] * 3
    for team in ("waiting", "new_team"):  # the old model's version, or none yet
        assert by_team[team].embed_model == OLD.embed_model_tag
        assert by_team[team].vector == [1.0] * 3
    assert sorted(model or "" for _, _, model in embedder.calls) == ["", NEW.embed_model_tag]


def test_without_a_change_a_write_never_asks_the_store_for_its_model():
    store = LiveModelStore({"t": NEW.embed_model_tag})
    embedder = ByModel()
    pipeline = pipeline_over(store, embedder, [])
    doc = SourceDocument(team_id="t", doc_id="d", title="t", text="some notes")
    assert not asyncio.run(pipeline.ingest([doc])).failed
    assert {c.embed_model for c in store.rows.values()} == {OLD.embed_model_tag}
    assert [model for _, _, model in embedder.calls] == [None]


# --- the Retriever: the vector of the version each search reads ----------------------------
class Changes:
    """The change log's heads of one alias: its swap token changes at each switch."""

    def __init__(self) -> None:
        self.swap = "s1"

    def heads(self, alias: str) -> Any:
        from deployments.vector_store.memindex.changes import Heads

        return Heads(rows="r", swap=self.swap)


class TwoVersions:
    """A team's alias over v1 (old model) and, after ``swap``, v2 (the next model)."""

    def __init__(self) -> None:
        self.live = "rag__t__v1"
        self.changes = Changes()
        self.models = {"rag__t__v1": OLD.embed_model_tag, "rag__t__v2": NEW.embed_model_tag}

    def collection_for(self, team_id: str) -> str:
        return "rag__t"

    def live_physical(self, team_id: str) -> str | None:
        return self.live

    def model_of(self, physical: str) -> str | None:
        return self.models.get(physical)

    def swap(self) -> None:
        self.live, self.changes.swap = "rag__t__v2", "s2"


class StoreOfTwoVersions:
    def __init__(self) -> None:
        self.versions = TwoVersions()
        self.shapes = self.versions  # model_of, as the store's CollectionShapes answers it
        self.searches: list[tuple[str | None, list[float] | None, bool]] = []

    def search(self, text, vector, flt, limit, mode, lexical=None, *, physical=None, strict=False):
        self.searches.append((physical, vector, strict))
        return []


def test_the_retriever_searches_each_version_with_its_models_vector():
    from deployments.config import MilvusSettings
    from deployments.protocols import SearchFilter
    from deployments.vector_store.deployment import RetrieverDeployment

    store = StoreOfTwoVersions()
    settings = MilvusSettings(memory_index={"enabled": False})
    retriever = RetrieverDeployment(settings, 384, store=store)  # type: ignore[arg-type]
    vectors = {OLD.embed_model_tag: [1.0, 1.0, 1.0], NEW.embed_model_tag: [2.0, 2.0]}
    flt = SearchFilter(team_id="t")

    def dense(read_id: str) -> None:
        asyncio.run(
            retriever.candidates("q", None, flt, 5, ("dense",), read_id, query_vectors=vectors)
        )

    dense("before")
    store.versions.swap()
    dense("after")
    dense("before")  # a later call of a search that read v1 before the switch
    assert store.searches == [
        ("rag__t__v1", [1.0, 1.0, 1.0], True),
        ("rag__t__v2", [2.0, 2.0], True),
        ("rag__t__v1", [1.0, 1.0, 1.0], True),
    ]
    # Without ``query_vectors`` (one model served) nothing changes: the vector as given.
    asyncio.run(retriever.candidates("q", [0.5], flt, 5, ("dense",), "plain"))
    assert store.searches[-1] == ("rag__t__v2", [0.5], False)


def test_a_job_started_by_the_gateway_embeds_with_the_model_it_was_deployed_with(monkeypatch):
    import json

    from batch_ingest.reindex.launcher import JOB_SECTIONS, _dump

    def job_settings(gateway: BatchSettings) -> BatchSettings:
        # What run_job rebuilds from the sections the launcher sends (as JSON to a process).
        overrides = {name: _dump(getattr(gateway, name)) for name in JOB_SECTIONS}
        return BatchSettings(**json.loads(json.dumps(overrides)))

    monkeypatch.setenv("EMBEDDER_NEXT__MODEL_NAME", "stale-env-model")
    changing = job_settings(BatchSettings(embedder=OLD, embedder_next=NEW))
    assert changing.reindex_embedder.embed_model_tag == NEW.embed_model_tag
    settled = job_settings(BatchSettings(embedder=OLD, embedder_next=None))
    assert settled.reindex_embedder.embed_model_tag == OLD.embed_model_tag
