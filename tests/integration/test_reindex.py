"""``reindex(team_id)`` against the real Milvus Lite server, the real default embedder and a
local Ray instance (the only Ray in this suite; module-scoped, 2 CPUs).

The team is first ingested with an older model tag and a smaller chunker, so the reindex is a
real migration: different chunk counts, every row re-embedded under the current tag.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from batch_ingest.chunking import Chunker, tokenizer_counter
from batch_ingest.chunks import chunk_builder
from batch_ingest.documents import SourceDocument
from batch_ingest.generations import IndexGenerations
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.reindex import Reindexer, ReindexOptions
from batch_ingest.reindex.launcher import ReindexJobs
from batch_ingest.reindex.state import ReindexState
from batch_ingest.reindex.worker import ReindexWorker, worker_spec
from batch_ingest.source_store import SourceStore
from deployments.models.embedding import default_model_path
from deployments.protocols import SearchFilter
from deployments.vector_store.baseline import hybrid_search, search_by_mode
from deployments.vector_store.deployment import RetrieverDeployment
from deployments.vector_store.store import MilvusStore
from tests.faults import InjectedFailure, failing_after

pytestmark = pytest.mark.integration

OLD_MODEL = "all-MiniLM-L6-v2@v0"
TOPICS = [
    "solar panels on the school roof",
    "tomato harvest of the greenfood cooperative",
    "bicycle repair workshop schedule",
    "community library opening hours",
    "water filter maintenance in the district",
    "beekeeping course for beginners",
    "electric bus charging depot",
    "composting rules for the market",
]


@pytest.fixture
def team() -> str:
    return f"reidx_{uuid.uuid4().hex[:8]}"


def documents(team: str, n: int) -> list[SourceDocument]:
    docs = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        text = "\n\n".join(
            f"## Part {p}\n\nNotes {i}.{p} about {topic}: who does what, when and why. "
            f"The team agreed on item {p} of document {i}, and {topic} stays on the agenda."
            for p in range(4)
        )
        docs.append(SourceDocument(team_id=team, doc_id=f"doc{i:03d}", title=topic, text=text))
    return docs


async def ingest_old(job_settings, store, embedder, docs) -> SourceStore:
    """The team as an older deployment left it: v1, old model tag, 48-token chunks."""
    sources = SourceStore(job_settings.state.url)
    retriever = RetrieverDeployment(job_settings.milvus, 384)
    retriever.store = store
    pipeline = IngestPipeline(
        embedder=embedder,
        store=retriever,
        graph=None,
        chunker=Chunker(tokenizer_counter(default_model_path()), 48, 8),
        embed_model=OLD_MODEL,
        sources=sources,
    )
    report = await pipeline.ingest(docs)
    assert not report.failed
    store.flush(docs[0].team_id)
    return sources


def expected_chunks(job_settings, docs) -> int:
    builder = chunk_builder(job_settings.chunking, job_settings.embedder)
    return sum(len(builder.build_chunks(d)) for d in docs)


def models_in(store: MilvusStore, team: str) -> dict[str, int]:
    rows = store.conn.call(
        "query",
        "query",
        store.collection_for(team),
        filter=f'team_id == "{team}"',
        output_fields=["chunk_id", "embed_model"],
        limit=16384,
    )
    ids = [r["chunk_id"] for r in rows]
    assert len(ids) == len(set(ids))
    out: dict[str, int] = {}
    for r in rows:
        out[r["embed_model"]] = out.get(r["embed_model"], 0) + 1
    return out


async def test_reindex_while_searching_swaps_without_a_failed_or_empty_search(
    ray_local, job_settings, store, embedder, team
):
    docs = documents(team, 8)
    await ingest_old(job_settings, store, embedder, docs)
    assert store.versions.current(team) == 1
    assert set(models_in(store, team)) == {OLD_MODEL}
    # The team's index generation (the gateway's semantic cache keys by it).
    generations = IndexGenerations(SourceStore(job_settings.state.url).engine)
    generation = generations.get(team)

    # A second client, as a Serve replica would have, searching in a loop.
    searcher = MilvusStore(job_settings.milvus, dim=384)
    queries = [(t, (await embedder.embed([t], "query"))[0].tolist()) for t in TOPICS]
    flt = SearchFilter(team_id=team)
    stop = threading.Event()
    results: list[int] = []
    errors: list[str] = []

    def search_loop() -> None:
        i = 0
        while not stop.is_set():
            text, vector = queries[i % len(queries)]
            mode = ("hybrid", "dense", "bm25")[i % 3]
            try:
                hits = search_by_mode(searcher, text, vector, flt, 5, mode)
                results.append(len(hits))
                if not hits:
                    errors.append(f"empty {mode} search for {text!r}")
            except Exception as exc:  # noqa: BLE001 (the test reports every failure)
                errors.append(f"{mode}: {type(exc).__name__}: {exc}")
            i += 1
            time.sleep(0.02)

    thread = threading.Thread(target=search_loop, daemon=True)
    thread.start()
    try:
        # Submitted as the admin API does on a Serve cluster: a Ray task running run_job.
        # (The documents are > clock_skew_s old by then: no catch-up pass is needed.)
        time.sleep(5)
        pool = job_settings.reindex.model_copy(update={"actors": 2, "batch_size": 2})
        jobs = ReindexJobs(job_settings.model_copy(update={"reindex": pool}))
        assert jobs.runner() == "ray"
        submitted = jobs.submit(team, "test")
        deadline = time.monotonic() + 300
        while True:
            job = jobs.get(submitted.job_id)
            if job.status in ("succeeded", "failed") or job.error:
                break
            assert time.monotonic() < deadline, job
            time.sleep(1)
        time.sleep(0.5)  # searches after the old version is dropped
    finally:
        stop.set()
        thread.join(30)
        searcher.close()

    assert errors == []
    assert len(results) >= 20 and min(results) > 0
    assert job.status == "succeeded", job.error
    assert (job.source_version, job.target_version) == (1, 2)
    assert job.total_docs == job.done_docs == len(docs)
    assert job.rate_chunks_s > 0 and job.eta_s == 0
    assert store.versions.current(team) == 2
    assert store.versions.existing(team) == [2]  # the old version is dropped (no --keep-previous)
    # Raised at the swap and after the last catch-up: answers cached before are unreachable.
    assert generations.get(team) >= generation + 2
    n = expected_chunks(job_settings, docs)
    assert job.expected_chunks == job.rows_in_target == n
    assert store.count(team) == n
    assert models_in(store, team) == {job_settings.embedder.embed_model_tag: n}
    # Every document is still found by its own topic.
    for i, doc in enumerate(docs[: len(TOPICS)]):
        text, vector = queries[i]
        hits = hybrid_search(store, text, vector, flt, 10)
        assert doc.doc_id in {h.chunk.doc_id for h in hits}


async def test_crash_mid_way_then_resume_completes_exactly(
    ray_local, job_settings, store, embedder, team
):
    docs = documents(team, 8)
    sources = await ingest_old(job_settings, store, embedder, docs)
    spec = worker_spec(job_settings)

    def local_worker(physical: str, check: bool) -> ReindexWorker:
        return ReindexWorker(
            spec,
            physical,
            check,
            versions=store.versions,
            embed=lambda texts: embedder.core.embed(texts, "passage"),
        )

    # The crash: the in-process engine dies after 4 recorded documents (one more batch of 2
    # reached Milvus unrecorded).
    with pytest.raises(InjectedFailure):
        Reindexer(
            job_settings,
            versions=store.versions,
            sources=sources,
            worker_factory=local_worker,
            wrap_sink=failing_after(4),
        ).run(ReindexOptions(team_id=team, engine="local", batch_size=2, clock_skew_s=0))
    state = ReindexState(sources.engine)
    [job] = state.unfinished(team)
    assert job.status == "failed" and job.target_version == 2
    assert len(state.done(job.job_id)) == 4
    physical = store.versions.name(team, 2)
    assert 0 < store.versions.count(physical) < expected_chunks(job_settings, docs)
    assert store.versions.current(team) == 1  # searches still see the complete v1

    result = Reindexer(job_settings, versions=store.versions, sources=sources).run(
        ReindexOptions(
            team_id=team, engine="ray", actors=1, batch_size=2, resume=True, clock_skew_s=0
        )
    )
    job = result.job
    assert job.status == "succeeded" and job.target_version == 2
    n = expected_chunks(job_settings, docs)
    assert job.rows_in_target == job.expected_chunks == n
    assert store.versions.current(team) == 2 and store.versions.existing(team) == [2]
    assert models_in(store, team) == {job_settings.embedder.embed_model_tag: n}
    # The unrecorded batch was found in v2 by chunk id and not embedded again.
    assert job.skipped_docs == 2
    assert state.unfinished(team) == []


async def test_a_job_waiting_for_cpus_says_so_and_runs_once_they_are_free(
    ray_local, job_settings, store, embedder, team
):
    import ray

    docs = documents(team, 4)
    sources = await ingest_old(job_settings, store, embedder, docs)

    # A Serve replica's part: an actor holding every free CPU of the cluster.
    @ray.remote
    class Holder:
        def ready(self) -> bool:
            return True

    free = ray.available_resources().get("CPU", 0.0)
    holder = Holder.options(num_cpus=free).remote()
    ray.get(holder.ready.remote(), timeout=60)
    state = ReindexState(sources.engine)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = Reindexer(
                job_settings, versions=store.versions, sources=sources
            ).run(
                ReindexOptions(
                    team_id=team, engine="ray", batch_size=2, clock_skew_s=0, log_every_s=0.5
                )
            )
        except Exception as exc:  # noqa: BLE001 (reported by the assertions below)
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while True:
            jobs = state.unfinished(team)
            if jobs and jobs[0].note:
                break
            assert time.monotonic() < deadline and thread.is_alive(), (jobs, outcome)
            time.sleep(0.2)
        [job] = jobs
        assert job.status == "running" and job.done_docs == 0
        assert "waiting for CPUs" in job.note
        assert "are free (Serve replicas or other jobs hold the rest)" in job.note
    finally:
        ray.kill(holder)
    thread.join(300)
    assert not thread.is_alive() and "error" not in outcome, outcome
    done = outcome["result"].job  # type: ignore[attr-defined]
    assert done.status == "succeeded" and done.note is None
    assert state.get(done.job_id).note is None
    assert done.total_docs == done.done_docs == len(docs)
