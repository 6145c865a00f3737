"""No acknowledged write is undone by a reindex (issue 33), against the real Milvus Lite
server, the real default embedder and the write barrier on a SQLite state file.

A writer tightens the access list of (or deletes) documents one after another while reindex
jobs of the same team run back to back, so the writes land at every phase of a job: the bulk
pass, the catch-ups, the pause of the switch, right after it. After each acknowledgement,
and continuously between them, two Retriever replicas (their in-memory indexes and Milvus)
are asked for every document revoked so far, as a team member outside the new access list:
not one may come back. At the end every tightened document is still there for the group it
was tightened to (the write was not lost either).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest

from batch_ingest.chunks import chunk_builder
from batch_ingest.documents import DocumentAcl, SourceDocument
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.reindex import Reindexer, ReindexOptions
from batch_ingest.source_store import SourceStore
from deployments.acl import principal_tokens
from deployments.protocols import SearchFilter
from deployments.vector_store.deployment import RetrieverDeployment
from tests.integration.test_reindex import TOPICS

pytestmark = pytest.mark.integration

DOCS = 150
WRITES = 110
JOBS = 3


def document(team: str, i: int, acl: DocumentAcl | None = None) -> SourceDocument:
    topic = TOPICS[i % len(TOPICS)]
    text = "\n\n".join(
        f"Notes {i}.{p} about {topic}: the group met on item {p}; marker{i} stays open."
        for p in range(3)
    )
    return SourceDocument(team_id=team, doc_id=f"w{i:03d}", title=topic, text=text, acl=acl)


@pytest.fixture
def setup(settings, embedder, tmp_path):
    milvus = settings.milvus.model_copy(update={"collection": f"rw_{uuid.uuid4().hex[:10]}"})
    state = settings.state.model_copy(update={"url": f"sqlite:///{tmp_path}/state.db"})
    job_settings = settings.model_copy(update={"milvus": milvus, "state": state})
    sources = SourceStore(state.url)
    writer = RetrieverDeployment(milvus, 384)
    pipeline = IngestPipeline(
        embedder=embedder,
        store=writer,
        graph=None,
        chunker=chunk_builder(job_settings.chunking, job_settings.embedder).chunker,
        embed_model=job_settings.embedder.embed_model_tag,
        sources=sources,
    )
    replicas = [RetrieverDeployment(milvus, 384) for _ in range(2)]
    yield job_settings, sources, writer, pipeline, replicas
    writer.store.drop()
    for r in (writer, *replicas):
        r.store.close()
        if r.hot is not None:
            r.hot.close()


async def leaked(replicas, team: str, revoked: set[str]) -> list[str]:
    """Revoked documents any replica still returns to a member outside the new ACL."""
    if not revoked:
        return []
    flt = SearchFilter(
        team_id=team,
        visibilities=("public", "confidential"),
        doc_ids=tuple(sorted(revoked)),
        acl_principals=principal_tokens("eve", ["sales"]),
    )
    out = []
    for replica in replicas:
        found = await replica.candidates("marker stays open", None, flt, 50, ("bm25",))
        out += [h.chunk.doc_id for h in found["bm25"]]
    return out


async def explain(n, replica, writer, pipeline, hr, got, tightened, jobs, written) -> str:
    """Where the tightened documents a replica did not return are: its in-memory copy,
    Milvus's answer in the live version, the stored rows (a failure's message)."""
    team = hr.team_id
    missing, extra = sorted(tightened - got), sorted(got - tightened)
    lines = [f"replica {n}: missing {missing}, unexpected {extra}"]
    physical = await asyncio.to_thread(writer.store.versions.live_physical, team)
    lines.append(f"live version {physical}")
    lines += [
        f"job v{r.job.target_version}: {r.job.snapshot_at:%T.%f} - {r.job.finished_at:%T.%f}"
        for r in jobs
    ]
    lines.append(f"written (UTC): {[(d, written[d]) for d in missing]}")
    milvus = await replica._search(
        "marker stays open", None, hr, 500, ("bm25",), physical=physical, strict=True
    )
    in_milvus = {h.chunk.doc_id for h in milvus["bm25"]}
    lines.append(f"Milvus BM25 in {physical} misses {sorted(tightened - in_milvus)}")
    ids = {
        c.chunk_id: d
        for d in missing
        for c in pipeline.build_chunks(document(team, int(d[1:])))  # ids ignore the ACL
    }
    rows = await asyncio.to_thread(writer.store.versions.fetch_rows, physical, list(ids))
    lines.append(f"stored rows: {sorted((ids[r.chunk_id], r.acl_allow) for r in rows)}")
    hot = replica.hot
    copy = hot._teams.get(team) if hot is not None else None
    if copy is None:
        lines.append("the team is not in memory (Milvus answered)")
    else:
        held = [ids[c] for c in ids if c in copy.index]
        lines.append(f"memory copy of {copy.physical} holds chunks of {sorted(held)}")
    if hot is not None:
        lines.append(f"memory stats {hot.stats} {hot.staging.stats}")
    return "\n".join(lines)


async def test_no_acl_tightening_or_delete_is_undone_by_a_reindex(setup):
    job_settings, sources, writer, pipeline, replicas = setup
    team = f"rw_{uuid.uuid4().hex[:8]}"
    report = await pipeline.ingest([document(team, i) for i in range(DOCS)])
    assert not report.failed
    writer.store.flush(team)
    for r in replicas:
        assert r.hot is not None and r.hot.wait_loaded(team, 60)

    jobs: list = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def run_jobs() -> None:
        # Back to back until the writer is done (and at least JOBS of them).
        try:
            while len(jobs) < JOBS or not stop.is_set():
                jobs.append(
                    Reindexer(job_settings, versions=writer.store.versions, sources=sources).run(
                        ReindexOptions(team_id=team, engine="local", batch_size=4, log_every_s=60)
                    )
                )
        except BaseException as exc:  # noqa: BLE001 (asserted below)
            errors.append(exc)

    rng = random.Random(33)
    revoked: set[str] = set()
    tightened: set[str] = set()
    written: dict[str, str] = {}  # doc id -> when its write was acknowledged
    leaks: list[tuple[str, list[str]]] = []
    checks = 0
    thread = threading.Thread(target=run_jobs, daemon=True)
    thread.start()
    open_docs = list(range(DOCS))
    rng.shuffle(open_docs)
    started = time.monotonic()
    writes = 0
    # At least WRITES writes, until at least JOBS jobs finished.
    while (writes < WRITES or len(jobs) < JOBS) and open_docs and not errors:
        i = open_docs.pop()
        doc_id = f"w{i:03d}"
        if rng.random() < 0.5:
            acl = DocumentAcl(allowed_groups=["hr"])
            result = await pipeline.ingest([document(team, i, acl)])
            assert not result.failed, result
            tightened.add(doc_id)
        else:
            result = await pipeline.delete([(team, "doc", doc_id)])
            assert not result.failed, result
        revoked.add(doc_id)  # acknowledged
        written[doc_id] = f"{datetime.now(UTC):%T.%f}"
        writes += 1
        for _ in range(rng.randint(1, 3)):
            found = await leaked(replicas, team, revoked)
            checks += 1
            if found:
                leaks.append((f"after write {writes} at {time.monotonic() - started:.2f}s", found))
            await asyncio.sleep(rng.uniform(0, 0.05))
        if time.monotonic() - started > 400:
            break
    stop.set()
    while thread.is_alive():
        found = await leaked(replicas, team, revoked)
        checks += 1
        if found:
            leaks.append(("while the last job finished", found))
        await asyncio.sleep(0.05)
    assert not errors, errors
    assert leaks == [], leaks[:5]
    assert writes >= WRITES, f"only {writes} writes ({len(jobs)} jobs)"
    assert len(jobs) >= JOBS and all(j.job.status == "succeeded" for j in jobs)
    assert checks > writes
    # Nothing was lost: each tightened document is there for its group, the deleted are gone.
    hr = SearchFilter(
        team_id=team,
        visibilities=("public", "confidential"),
        doc_ids=tuple(sorted(tightened)),
        acl_principals=principal_tokens("hana", ["hr"]),
    )
    for n, replica in enumerate(replicas):
        found = await replica.candidates("marker stays open", None, hr, 500, ("bm25",))
        got = {h.chunk.doc_id for h in found["bm25"]}
        if got != tightened:  # say where the difference is: memory, Milvus or the rows
            why = await explain(n, replica, writer, pipeline, hr, got, tightened, jobs, written)
            pytest.fail(why)
    live = await writer.count(team)
    expected = sum(
        len(pipeline.build_chunks(document(team, i)))
        for i in range(DOCS)
        if f"w{i:03d}" not in revoked - tightened
    )
    assert live == expected
