"""A change of embedding model end to end (issue 33), against the real Milvus Lite server: the
packaged all-MiniLM-L6-v2 (384-d) is the old model, a tiny BERT built here (64-d, random
weights, offline) the next one (``embedder_next``).

The team is ingested with the old model; then a reindex job embeds it with the next model
into v2 and switches the alias while a Retriever replica (its in-memory index and Milvus) is
searched in a loop with the query embedded by both models, as the ingress does during a
change, and documents are written through the ingestion pipeline. Every search must read one
version with that version's model: each probe document is its own nearest dense neighbour
(cosine ~1.0, which a vector of the other model cannot give) and is found by its marker
word, v1 until the switch and v2 after it, never back. Writes made during the job and after
the switch survive, the latter embedded with the next model.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from batch_ingest.chunks import chunk_builder
from batch_ingest.documents import SourceDocument
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.reindex import Reindexer, ReindexOptions
from batch_ingest.source_store import SourceStore
from deployments.config import EmbedderSettings
from deployments.models.embedder_models import LocalModels
from deployments.protocols import SearchFilter
from deployments.testing.tiny_models import build_tiny_embedder
from deployments.vector_store.deployment import RetrieverDeployment
from tests.integration.test_reindex import TOPICS

pytestmark = pytest.mark.integration

DOCS = 60
# Searches go on this long after the job ended (the new version is live by then).
AFTER_S = 1.5
# torch fp32: a probe must be its own nearest neighbour at cosine ~1.0, which int8 (its
# activations quantised per batch) does not give between a passage and a lone query.
OLD = EmbedderSettings(backend="transformers")  # all-MiniLM-L6-v2@v1, 384-d


@pytest.fixture(scope="module")
def new_model(tmp_path_factory) -> EmbedderSettings:
    path = build_tiny_embedder(tmp_path_factory.mktemp("tiny") / "tiny-embed", hidden=64)
    return EmbedderSettings(model_path=str(path), model_name="tiny-embed", model_version="v1")


def document(team: str, name: str, i: int) -> SourceDocument:
    topic = TOPICS[i % len(TOPICS)]
    text = f"Notes {name} about {topic}: the group met on item {i}; marker{name} stays open."
    return SourceDocument(team_id=team, doc_id=name, title=topic, text=text)


@pytest.fixture
def setup(settings, new_model, tmp_path):
    milvus = settings.milvus.model_copy(update={"collection": f"mc_{uuid.uuid4().hex[:10]}"})
    state = settings.state.model_copy(update={"url": f"sqlite:///{tmp_path}/state.db"})
    job_settings = settings.model_copy(
        update={"milvus": milvus, "state": state, "embedder": OLD, "embedder_next": new_model}
    )
    models = {OLD.embed_model_tag: 384, new_model.embed_model_tag: 64}
    sources = SourceStore(state.url)
    embedder = LocalModels(OLD, new_model)
    embedder.models.start()
    writer = RetrieverDeployment(milvus, 384, models=models)
    pipeline = IngestPipeline(
        embedder=embedder,
        store=writer,
        graph=None,
        chunker=chunk_builder(job_settings.chunking, OLD).chunker,
        embed_model=OLD.embed_model_tag,
        sources=sources,
        other_models=[new_model.embed_model_tag],
    )
    searcher = RetrieverDeployment(milvus, 384, models=models)
    yield job_settings, sources, embedder, writer, pipeline, searcher
    writer.store.drop()
    for r in (writer, searcher):
        r.store.close()
        if r.hot is not None:
            r.hot.close()


class Probe:
    """One document's two queries (its marker word, its own chunk text) embedded with every
    served model."""

    def __init__(self, doc_id: str, marker: str, text: str, vectors: dict[str, dict]) -> None:
        self.doc_id, self.marker, self.text, self.vectors = doc_id, marker, text, vectors


async def probe(pipeline, embedder: LocalModels, doc: SourceDocument) -> Probe:
    text = pipeline.build_chunks(doc)[0].text
    vectors = {
        tag: (await embedder.embed([text], "query", model=tag))[0].tolist()
        for tag in embedder.models.tags
    }
    return Probe(doc.doc_id, f"marker{doc.doc_id}", text, vectors)


async def search(searcher: RetrieverDeployment, team: str, p: Probe) -> tuple[str, str]:
    """Search ``p`` as the ingress does during a change (one read id, the vector per model);
    the version it read and that version's model. Fails on any answer that is not right."""
    flt = SearchFilter(team_id=team)
    read = uuid.uuid4().hex
    dense = await searcher.candidates(
        p.text, None, flt, 5, ("dense",), read, query_vectors=p.vectors
    )
    physical = searcher.pins.get(team, read)
    assert physical is not None
    lexical = await searcher.candidates(p.marker, None, flt, 5, ("bm25",), read)
    model = searcher.store.shapes.model_of(physical)
    hits = dense["dense"]
    assert hits, f"no dense hit for {p.doc_id} in {physical}"
    # Its own text is its nearest neighbour at cosine ~1: only with the version's model.
    assert hits[0].chunk.doc_id == p.doc_id and hits[0].score > 0.999, (physical, hits[0])
    assert {h.chunk.embed_model for h in hits} == {model}, (physical, model)
    assert p.doc_id in {h.chunk.doc_id for h in lexical["bm25"]}, (physical, p.marker)
    return physical, str(model)


async def test_a_model_change_searches_old_then_new_and_keeps_every_write(setup, new_model):
    job_settings, sources, embedder, writer, pipeline, searcher = setup
    team = f"mc_{uuid.uuid4().hex[:8]}"
    old_tag, new_tag = OLD.embed_model_tag, new_model.embed_model_tag
    docs = [document(team, f"d{i:02d}", i) for i in range(DOCS)]
    report = await pipeline.ingest(docs)
    assert not report.failed
    writer.store.flush(team)
    assert searcher.hot is not None and searcher.hot.wait_loaded(team, 60)
    versions, shapes = writer.store.versions, writer.store.shapes
    assert versions.current(team) == 1 and shapes.model_of(versions.name(team, 1)) == old_tag
    probes = [await probe(pipeline, embedder, d) for d in docs]

    jobs: list = []
    errors: list[BaseException] = []

    def run_job() -> None:
        try:
            jobs.append(
                Reindexer(job_settings, versions=versions, sources=sources).run(
                    ReindexOptions(team_id=team, engine="local", batch_size=4, log_every_s=60)
                )
            )
        except BaseException as exc:  # noqa: BLE001 (asserted below)
            errors.append(exc)

    seen: list[tuple[float, str, str]] = []  # (time, physical, model) of each search
    failures: list[str] = []
    written: list[SourceDocument] = []
    thread = threading.Thread(target=run_job, daemon=True)
    started = time.monotonic()
    thread.start()
    i = 0
    ended: float | None = None
    took = 0.0
    during = 0  # writes acknowledged while the job ran
    while ended is None or time.monotonic() - ended < AFTER_S:
        if ended is None and not thread.is_alive():
            ended = time.monotonic()
            took, during = ended - started, len(written)
        p = probes[i % len(probes)]
        try:
            physical, model = await search(searcher, team, p)
            seen.append((time.monotonic() - started, physical, model))
        except Exception as exc:  # noqa: BLE001 (every failure is reported)
            failures.append(f"{p.doc_id}: {type(exc).__name__}: {exc}")
        if i % 7 == 3:  # a write while the job runs, at whatever phase it is in
            doc = document(team, f"w{len(written):02d}", 100 + len(written))
            result = await pipeline.ingest([doc])
            assert not result.failed, result
            written.append(doc)
        i += 1
        await asyncio.sleep(0.01)
    assert not errors, errors
    assert failures == [], failures[:5]
    job = jobs[0].job
    assert job.status == "succeeded" and (job.source_version, job.target_version) == (1, 2)
    assert job.embed_model == new_tag
    v1, v2 = versions.name(team, 1), versions.name(team, 2)
    # Old version with the old model until the switch, the new with the new model after,
    # never back.
    assert {(ph, m) for _, ph, m in seen} <= {(v1, old_tag), (v2, new_tag)}
    physicals = [ph for _, ph, _ in seen]
    assert v1 in physicals and v2 in physicals
    assert all(ph == v2 for ph in physicals[physicals.index(v2) :])

    # After the switch: a write embedded with the new model (the live version's).
    after = document(team, "after", 999)
    result = await pipeline.ingest([after])
    assert not result.failed, result
    written.append(after)
    writer.store.flush(team)
    assert versions.current(team) == 2 and versions.existing(team) == [2]
    assert shapes.model_of(v2) == new_tag and shapes.dim_of(v2) == 64
    stored = writer.store.get_chunks(team, "doc", "after")
    assert stored and {c.embed_model for c in stored} == {new_tag}
    # Not one row of another model: the job's catch-ups re-embedded the writes made during
    # it, the pipeline embedded those after the switch with the new model.
    assert versions.count(v2, f'embed_model != "{new_tag}"') == 0
    assert 0 < during < len(written)

    # Every document, those written during the job and after it included, is found with
    # new-model query vectors (its own neighbour at cosine ~1) and by its marker word.
    every = [await probe(pipeline, embedder, d) for d in docs + written]
    assert {await search(searcher, team, p) for p in every} == {(v2, new_tag)}
    # ... from the searcher's in-memory copy of v2 (64-d) as well, once it holds it.
    assert searcher.hot.wait_loaded(team, 60)
    hits = searcher.hot.stats["hits"]
    assert {await search(searcher, team, p) for p in every} == {(v2, new_tag)}
    assert searcher.hot.stats["hits"] - hits == 2 * len(every)
    n = sum(len(pipeline.build_chunks(d)) for d in docs + written)
    assert await writer.count(team) == n
    status = searcher.hot.status()
    print(
        f"\nmodel change: job {took:.1f}s, {len(seen)} searches during it and {AFTER_S}s after "
        f"({physicals.count(v1)} on v1/{old_tag}, {physicals.count(v2)} on v2/{new_tag}), "
        f"{during} writes during it and {len(written) - during} after, 0 errors; "
        f"memory index {status['hits']} hits, "
        f"{status['adoptions']} adoptions, {status['loads']} loads"
    )
