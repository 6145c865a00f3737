"""Ingestion → search on the real embedder, Milvus Lite server and Neo4j, without Ray."""

from __future__ import annotations

import uuid

import pytest

from batch_ingest.chunking import Chunker, tokenizer_counter
from batch_ingest.documents import SourceDocument
from batch_ingest.pipeline import IngestPipeline
from deployments.models.embedding import default_model_path
from deployments.protocols import SearchFilter
from deployments.vector_store.baseline import hybrid_search
from deployments.vector_store.deployment import RetrieverDeployment

pytestmark = pytest.mark.integration


@pytest.fixture
def team() -> str:
    return f"team_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pipeline(settings, embedder, graph, store):
    retriever = RetrieverDeployment(settings.milvus, 384)
    retriever.store = store
    chunker = Chunker(tokenizer_counter(default_model_path()), max_tokens=64, overlap_tokens=8)
    return IngestPipeline(
        embedder=embedder,
        store=retriever,
        graph=graph,
        chunker=chunker,
        embed_model="all-MiniLM-L6-v2@v1",
    )


def source(team: str, doc_id: str, text: str, **kw) -> SourceDocument:
    return SourceDocument(
        team_id=team, doc_id=doc_id, title=kw.pop("title", doc_id), text=text, **kw
    )


LONG = "\n\n".join(
    f"## Section {i}\n\nParagraph {i} talks about solar panels, batteries and the grid "
    f"operator of district {i}. " * 3
    for i in range(6)
)


async def test_ingest_then_search_finds_the_document(pipeline, store, embedder, team):
    docs = [
        source(team, "milvus", "Our RAG stack stores embeddings in Milvus and the graph in Neo4j."),
        source(team, "food", "The greenfood cooperative ships tomato batches every Tuesday."),
    ]
    report = await pipeline.ingest(docs)
    assert [r.status for r in report.results] == ["indexed", "indexed"]
    assert all(r.graph for r in report.results)
    query = "which vector database do we use?"
    vector = (await embedder.embed([query], "query"))[0]
    hits = hybrid_search(store, query, list(vector), SearchFilter(team_id=team), 2)
    assert hits[0].chunk.doc_id == "milvus"
    assert hits[0].chunk.embed_model == "all-MiniLM-L6-v2@v1"


async def test_reingest_is_unchanged_and_edit_replaces_stale_chunks(pipeline, store, team):
    doc = source(team, "long", LONG)
    first = await pipeline.ingest([doc])
    n = first.results[0].chunks
    assert n > 3 and store.count(team) == n
    again = await pipeline.ingest([doc])
    assert again.results[0].status == "unchanged" and store.count(team) == n
    shorter = source(team, "long", "## Section 0\n\nOnly one paragraph remains.")
    edited = await pipeline.ingest([shorter])
    assert edited.results[0].status == "indexed"
    assert edited.results[0].removed_chunks == n - 1
    assert [c.text.splitlines()[-1] for c in store.get_chunks(team, "doc", "long")] == [
        "Only one paragraph remains."
    ]


async def test_graph_records_document_and_its_links(pipeline, graph, team):
    doc = source(
        team,
        "d",
        "Helion serves the energy union.",
        project_id="prj_energy",
        agent_id="helion",
        tags=["energy"],
    )
    await pipeline.ingest([doc])
    rows = await graph.client.run(
        "MATCH (a:Agent)-[:AUTHORED]->(d:Doc {team_id: $t, id: 'd'})-[:PART_OF]->(p:Project) "
        "RETURN a.id AS agent, p.id AS project",
        {"t": team},
    )
    assert rows == [{"agent": "helion", "project": "prj_energy"}]
    await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True)
