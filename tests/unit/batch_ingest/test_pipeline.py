"""IngestPipeline over the in-memory fakes: idempotency, replacement, partial failure."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from batch_ingest.chunking import Chunker, tokenizer_counter
from batch_ingest.chunks import compose_text, context_header, strip_header
from batch_ingest.documents import SourceDocument, make_chunk_id
from batch_ingest.pipeline import IngestPipeline
from deployments.errors import BackendUnavailable
from deployments.models.embedding import default_model_path
from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeVectorStore

EMBED_MODEL = "fake-embedder@v1"


def paragraph(topic: str, n: int) -> str:
    return "\n\n".join(
        f"Paragraph {i} about {topic}: the team stores {topic} notes and reviews them weekly."
        for i in range(n)
    )


def source(doc_id: str = "doc_1", **fields) -> SourceDocument:
    values = {
        "team_id": "dao_greenfood",
        "doc_id": doc_id,
        "title": f"Title of {doc_id}",
        "text": paragraph("milvus", 8),
        "project_id": "prj_x",
        "tags": ["rag"],
        "created_at": 1735689600,
    }
    values.update(fields)
    return SourceDocument.model_validate(values)


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(tokenizer_counter(default_model_path()), max_tokens=40, overlap_tokens=8)


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder(dim=16)


@pytest.fixture
def store() -> FakeVectorStore:
    return FakeVectorStore()


@pytest.fixture
def graph() -> FakeGraphStore:
    return FakeGraphStore()


@pytest.fixture
def pipeline(embedder, store, graph, chunker) -> IngestPipeline:
    return IngestPipeline(
        embedder=embedder, store=store, graph=graph, chunker=chunker, embed_model=EMBED_MODEL
    )


def doc_chunks(store: FakeVectorStore, doc_id: str) -> list:
    return sorted(
        (c for c in store.rows.values() if c.doc_id == doc_id), key=lambda c: c.chunk_index
    )


async def test_first_ingest_indexes_every_chunk_with_vector_and_metadata(pipeline, store, graph):
    doc = source()
    report = await pipeline.ingest([doc])
    [result] = report.results
    assert (result.status, result.graph, result.error) == ("indexed", True, None)
    stored = doc_chunks(store, "doc_1")
    assert result.chunks == len(stored) > 1
    for i, chunk in enumerate(stored):
        assert chunk.chunk_id == make_chunk_id("dao_greenfood", "doc", "doc_1", i)
        assert len(chunk.vector) == 16
        assert (chunk.team_id, chunk.project_id, chunk.visibility) == (
            "dao_greenfood",
            "prj_x",
            "public",
        )
        assert chunk.tags == ("rag",)
        assert chunk.created_at == 1735689600
        assert chunk.embed_model == EMBED_MODEL
        assert chunk.text.startswith("Title of doc_1\n\n")
    assert ("dao_greenfood", "doc_1") in graph.docs
    assert report.degraded == []


async def test_all_chunks_of_a_request_are_embedded_in_one_passage_call(pipeline, embedder):
    await pipeline.ingest([source("a"), source("b"), source("c")])
    assert len(embedder.calls) == 1
    assert embedder.calls[0][1] == "passage"


async def test_a_large_document_goes_in_slices_no_call_outgrows_a_message(
    pipeline, embedder, store, monkeypatch
):
    """A document of more chunks than CALL_MAX_CHUNKS: embedded in several concurrent calls
    and upserted in several calls of at most that many chunks (between Serve replicas one
    call is one gRPC message of at most 4 MiB), every chunk stored once, in order."""
    import batch_ingest.passage_vectors
    import batch_ingest.slice_writer

    for module in (batch_ingest.slice_writer, batch_ingest.passage_vectors):
        monkeypatch.setattr(module, "CALL_MAX_CHUNKS", 4)
    sizes: list[int] = []
    upsert = store.upsert

    async def counted(chunks):
        sizes.append(len(chunks))
        return await upsert(chunks)

    monkeypatch.setattr(store, "upsert", counted)
    report = await pipeline.ingest([source("big", text=paragraph("milvus", 30)), source("b")])
    total = sum(r.chunks for r in report.results)
    assert total > 8 and all(r.status == "indexed" for r in report.results)
    assert [len(texts) for texts, _ in embedder.calls] == [
        min(4, total - i) for i in range(0, total, 4)
    ]
    assert max(sizes) <= 4 and sum(sizes) == total
    chunks = doc_chunks(store, "big")
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert all(len(c.vector) == 16 for c in chunks)


async def test_reingest_of_same_document_is_unchanged_and_skips_embedder(pipeline, embedder, store):
    await pipeline.ingest([source()])
    calls_before, rows_before = len(embedder.calls), dict(store.rows)
    upserts_before = store.upsert_calls
    report = await pipeline.ingest([source()])
    [result] = report.results
    assert result.status == "unchanged"
    assert result.chunks == len(rows_before)
    assert len(embedder.calls) == calls_before
    assert store.upsert_calls == upserts_before
    assert store.rows == rows_before


async def test_unchanged_document_is_reported_beside_a_changed_one(pipeline, embedder):
    await pipeline.ingest([source("a"), source("b")])
    report = await pipeline.ingest([source("a"), source("b", text=paragraph("neo4j", 3))])
    assert [(r.doc_id, r.status) for r in report.results] == [
        ("a", "unchanged"),
        ("b", "indexed"),
    ]
    assert all("neo4j" in text for text in embedder.calls[-1][0])


async def test_edited_document_replaces_chunks_and_removes_stale_ones(pipeline, store):
    first = await pipeline.ingest([source(text=paragraph("milvus", 10))])
    old_ids = {c.chunk_id for c in doc_chunks(store, "doc_1")}
    assert len(old_ids) == first.results[0].chunks

    report = await pipeline.ingest([source(text=paragraph("graphs", 2))])
    [result] = report.results
    new = doc_chunks(store, "doc_1")
    assert result.status == "indexed"
    assert 0 < len(new) == result.chunks < len(old_ids)
    assert result.removed_chunks == len(old_ids) - len(new)
    stale = old_ids - {c.chunk_id for c in new}
    assert stale
    assert stale.isdisjoint(store.rows)
    assert all("graphs" in c.text and "milvus" not in c.text for c in new)
    assert [c.chunk_index for c in new] == list(range(len(new)))


async def test_edit_of_one_document_leaves_other_documents_alone(pipeline, store):
    await pipeline.ingest([source("a"), source("b")])
    b_before = doc_chunks(store, "b")
    await pipeline.ingest([source("a", text="now short")])
    assert doc_chunks(store, "b") == b_before
    assert [c.text for c in doc_chunks(store, "a")] == ["Title of a\n\nnow short"]


@pytest.mark.parametrize(
    "change",
    [
        {"tags": ["rag", "energy"]},
        {"title": "A new title"},
        {"mode": "confidential"},
        {"project_id": "prj_y"},
        {"url": "https://example.org/doc_1"},
        {"created_at": "2026-01-01T00:00:00Z"},
        {"acl": {"allowed_groups": ["hr"], "denied_groups": ["contractors"]}},
        {"acl": {"allowed_users": ["alice"]}},
    ],
    ids=["tags", "title", "visibility", "project", "url", "created_at", "acl", "acl_user"],
)
async def test_metadata_change_rewrites_chunks(pipeline, embedder, store, change):
    await pipeline.ingest([source()])
    vectors = {c.chunk_id: list(c.vector) for c in store.rows.values()}
    calls_before = len(embedder.calls)
    report = await pipeline.ingest([source(**change)])
    result = report.results[0]
    assert result.status == "indexed"
    changed = source(**change)
    # The title is part of every chunk's text: embedded again. Any other metadata keeps
    # the stored vectors (re-permissioned without embedding).
    if "title" in change:
        assert len(embedder.calls) == calls_before + 1
        assert result.embedded_chunks == result.chunks
    else:
        assert len(embedder.calls) == calls_before
        assert result.embedded_chunks == 0
        assert {c.chunk_id: list(c.vector) for c in store.rows.values()} == vectors
    for chunk in doc_chunks(store, "doc_1"):
        assert chunk.acl_allow == changed.acl_allow
        assert chunk.acl_deny == changed.acl_deny
        assert chunk.tags == tuple(changed.tags)
        assert chunk.visibility == changed.visibility
        assert chunk.project_id == changed.project_id
        assert chunk.url == changed.url
        assert chunk.title == changed.title
        assert chunk.created_at == changed.created_at


async def test_an_edit_embeds_only_the_chunks_whose_text_changed(pipeline, embedder, store):
    paragraphs = [f"Paragraph {i} about milvus and graphs, " * 12 for i in range(6)]
    await pipeline.ingest([source(text="\n\n".join(paragraphs))])
    first = len(store.rows)
    assert first > 2
    paragraphs[-1] = "A rewritten last paragraph about neo4j. " * 12
    report = await pipeline.ingest([source(text="\n\n".join(paragraphs))])
    result = report.results[0]
    assert result.status == "indexed"
    assert 0 < result.embedded_chunks < result.chunks


async def test_changed_embed_model_rewrites_chunks(embedder, store, graph, chunker):
    old = IngestPipeline(
        embedder=embedder, store=store, graph=graph, chunker=chunker, embed_model="m@v1"
    )
    new = IngestPipeline(
        embedder=embedder, store=store, graph=graph, chunker=chunker, embed_model="m@v2"
    )
    await old.ingest([source()])
    report = await new.ingest([source()])
    assert report.results[0].status == "indexed"
    assert {c.embed_model for c in store.rows.values()} == {"m@v2"}


async def test_failure_on_second_document_leaves_first_fully_indexed(embedder, graph, chunker):
    store = FakeVectorStore(fail_on_upsert=2)
    pipeline = IngestPipeline(
        embedder=embedder, store=store, graph=graph, chunker=chunker, embed_model=EMBED_MODEL
    )
    report = await pipeline.ingest([source("first"), source("second"), source("third")])
    by_id = {r.doc_id: r for r in report.results}
    assert by_id["first"].status == "indexed"
    assert len(doc_chunks(store, "first")) == by_id["first"].chunks > 0
    assert by_id["second"].status == "failed"
    assert "crash on call 2" in by_id["second"].error
    assert doc_chunks(store, "second") == []
    assert [r.doc_id for r in report.failed] == ["second"]
    assert by_id["third"].status == "indexed"
    assert set(graph.docs) == {("dao_greenfood", "first"), ("dao_greenfood", "third")}
    assert (by_id["first"].graph, by_id["second"].graph) == (True, False)


async def test_failed_document_is_indexed_on_retry(embedder, graph, chunker):
    store = FakeVectorStore(fail_on_upsert=2)
    pipeline = IngestPipeline(
        embedder=embedder, store=store, graph=graph, chunker=chunker, embed_model=EMBED_MODEL
    )
    await pipeline.ingest([source("first"), source("second")])
    retry = await pipeline.ingest([source("first"), source("second")])
    assert [(r.doc_id, r.status) for r in retry.results] == [
        ("first", "unchanged"),
        ("second", "indexed"),
    ]


async def test_store_failure_before_anything_is_written_raises(embedder, graph, chunker):
    store = FakeVectorStore(fail_on_upsert=1)
    pipeline = IngestPipeline(
        embedder=embedder, store=store, graph=graph, chunker=chunker, embed_model=EMBED_MODEL
    )
    with pytest.raises(BackendUnavailable):
        await pipeline.ingest([source("first"), source("second")])


async def test_embedder_down_raises_before_any_write(pipeline, embedder, store, graph):
    embedder.down = True
    with pytest.raises(BackendUnavailable, match="embedder"):
        await pipeline.ingest([source()])
    assert store.rows == {}
    assert graph.docs == {}


async def test_graph_down_still_indexes_documents_and_reports_degraded(pipeline, store, graph):
    graph.down = True
    report = await pipeline.ingest([source("a"), source("b")])
    assert [r.status for r in report.results] == ["indexed", "indexed"]
    assert [r.graph for r in report.results] == [False, False]
    assert doc_chunks(store, "a")
    assert doc_chunks(store, "b")
    assert len(report.degraded) == 1
    assert report.degraded[0].startswith("graph not updated")
    assert report.failed == []


async def test_reingest_after_graph_outage_repairs_the_graph(pipeline, graph):
    graph.down = True
    await pipeline.ingest([source()])
    graph.down = False
    await pipeline.ingest([source()])
    assert ("dao_greenfood", "doc_1") in graph.docs


async def test_reingest_with_null_created_at_is_unchanged(pipeline, embedder, monkeypatch):
    import batch_ingest.documents as documents

    real = documents.datetime

    class LaterClock(real):
        @classmethod
        def now(cls, tz=None):
            return real.now(tz) + timedelta(seconds=60)

    await pipeline.ingest([source(created_at=None)])
    monkeypatch.setattr(documents, "datetime", LaterClock)
    report = await pipeline.ingest([source(created_at=None)])
    assert report.results[0].status == "unchanged"


async def test_pipeline_without_graph_indexes_and_is_not_degraded(embedder, store, chunker):
    pipeline = IngestPipeline(
        embedder=embedder, store=store, graph=None, chunker=chunker, embed_model=EMBED_MODEL
    )
    report = await pipeline.ingest([source()])
    assert report.results[0].status == "indexed"
    assert report.results[0].graph is False
    assert report.degraded == []


async def test_same_doc_id_in_two_teams_is_kept_apart(pipeline, store):
    await pipeline.ingest([source(team_id="dao_a"), source(team_id="dao_b", text="other")])
    assert {c.team_id for c in store.rows.values()} == {"dao_a", "dao_b"}
    report = await pipeline.ingest([source(team_id="dao_a")])
    assert report.results[0].status == "unchanged"
    assert any(c.team_id == "dao_b" for c in store.rows.values())


async def test_graph_document_carries_document_metadata(pipeline, graph):
    await pipeline.ingest([source(channel_id="ch_1", agent_id="ag_1", doc_type="wiki")])
    merged = graph.docs[("dao_greenfood", "doc_1")]
    assert (merged.doc_type, merged.project_id, merged.channel_id, merged.agent_id) == (
        "wiki",
        "prj_x",
        "ch_1",
        "ag_1",
    )
    assert merged.tags == ("rag",)


async def test_empty_request_does_nothing(pipeline, embedder, graph):
    report = await pipeline.ingest([])
    assert report.results == []
    assert embedder.calls == []
    assert graph.merge_calls == 0


def test_stored_text_starts_with_title_and_heading_and_strips_back(pipeline):
    doc = source(text="# Setup\n\nInstall the client.", title="Guide")
    [chunk] = pipeline.build_chunks(doc)
    assert chunk.heading == "Setup"
    assert chunk.text == "Guide › Setup\n\nInstall the client."
    assert strip_header(chunk) == "Install the client."


def test_context_header_skips_missing_parts():
    assert context_header("", "") == ""
    assert context_header("T", "") == "T"
    assert context_header("", "H") == "H"
    assert compose_text("", "", "body") == "body"


def test_build_chunks_is_deterministic(pipeline):
    assert pipeline.build_chunks(source()) == pipeline.build_chunks(source())


class GatedEmbedder(FakeEmbedder):
    """Answers the calls after the first only once ``release`` is set; ``fail_after`` makes
    those calls fail instead (a replica lost mid-request)."""

    def __init__(self) -> None:
        super().__init__(dim=16)
        self.release = asyncio.Event()
        self.fail_after = False
        self.answered = 0

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        first = not self.calls
        self.calls.append((list(texts), kind))
        if not first:
            await self.release.wait()
            if self.fail_after:
                raise BackendUnavailable("embedder", "replica died")
        self.answered += 1
        return [self.vector(text) for text in texts]


def sliced_pipeline(embedder, store, graph, chunker, monkeypatch) -> IngestPipeline:
    import batch_ingest.pipeline

    monkeypatch.setattr(batch_ingest.pipeline, "WRITE_SLICE_CHUNKS", 1)  # a slice per document
    return IngestPipeline(
        embedder=embedder, store=store, graph=graph, chunker=chunker, embed_model=EMBED_MODEL
    )


async def test_a_slice_is_written_while_the_next_is_still_embedding(
    store, graph, chunker, monkeypatch
):
    """The first document's chunks are upserted and merged into the graph before the
    embedder has answered for the second: writing overlaps embedding."""
    embedder = GatedEmbedder()
    pipeline = sliced_pipeline(embedder, store, graph, chunker, monkeypatch)
    seen_at_first_write: list[int] = []
    upsert = store.upsert

    async def watched(chunks):
        seen_at_first_write.append(embedder.answered)
        embedder.release.set()  # the second slice's embedding may finish only now
        return await upsert(chunks)

    monkeypatch.setattr(store, "upsert", watched)
    report = await asyncio.wait_for(pipeline.ingest([source("a"), source("b")]), 10)
    assert [r.status for r in report.results] == ["indexed", "indexed"]
    assert seen_at_first_write[0] == 1  # only the first slice embedded at its write
    assert len(embedder.calls) == 2  # both slices were sent before the first write
    assert {("dao_greenfood", "a"), ("dao_greenfood", "b")} <= set(graph.docs)
    assert doc_chunks(store, "b") and all(r.graph for r in report.results)


async def test_an_embedding_lost_after_a_written_slice_fails_only_its_documents(
    store, graph, chunker, monkeypatch
):
    """Nothing accepted is lost: the written document stays indexed, the one whose
    embedding failed is reported failed and retryable (not raised), and a retry indexes it."""
    embedder = GatedEmbedder()
    embedder.fail_after = True
    embedder.release.set()
    pipeline = sliced_pipeline(embedder, store, graph, chunker, monkeypatch)
    report = await pipeline.ingest([source("a"), source("b")])
    a, b = report.results
    assert (a.doc_id, a.status, a.written) == ("a", "indexed", True)
    assert (b.doc_id, b.status, b.retryable, b.written) == ("b", "failed", True, False)
    assert "replica died" in (b.error or "")
    assert doc_chunks(store, "a") and not doc_chunks(store, "b")
    assert ("dao_greenfood", "b") not in graph.docs
    embedder.fail_after = False
    retry = await pipeline.ingest([source("a"), source("b")])
    assert [r.status for r in retry.results] == ["unchanged", "indexed"]


async def test_an_embedding_lost_before_anything_is_written_raises(
    store, graph, chunker, monkeypatch
):
    embedder = FakeEmbedder(dim=16)
    embedder.down = True
    pipeline = sliced_pipeline(embedder, store, graph, chunker, monkeypatch)
    with pytest.raises(BackendUnavailable):
        await pipeline.ingest([source("a"), source("b")])
    assert not store.rows and not graph.docs


async def test_a_backend_replaced_on_the_pipeline_is_the_one_every_stage_uses(
    pipeline, embedder, chunker
):
    """The bus consumer's tests (and a graph coming back) swap a backend on a built pipeline:
    the embedding, write and graph stages must all use the new one."""
    other_store, other_graph, other_embedder = FakeVectorStore(), FakeGraphStore(), FakeEmbedder(16)
    pipeline.store, pipeline.graph, pipeline.embedder = other_store, other_graph, other_embedder
    await pipeline.ingest([source("a")])
    assert doc_chunks(other_store, "a") and ("dao_greenfood", "a") in other_graph.docs
    assert other_embedder.calls and not embedder.calls
