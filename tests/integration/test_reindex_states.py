"""Honest reindex job states against the real Milvus server and the real default embedder
(issue 33), with the job rows on SQLite and, where heartbeats are compared, on PostgreSQL:
an unknown team refused with nothing left behind, ``--allow-empty``, a dead driver shown as
``stalled`` and resumable, no resume while the driver is alive, ``--clean-up`` of a failed
job's target, and counts after catch-up deletes equal to what is live. The in-process engine
(``engine="local"``) runs the jobs: no Ray here."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from batch_ingest.reindex import Reindexer, ReindexError, ReindexOptions, cli
from batch_ingest.reindex.launcher import ReindexJobs
from batch_ingest.reindex.state import JobStatus, ReindexState
from batch_ingest.reindex.team import UnknownTeam
from batch_ingest.reindex.worker import ReindexWorker, worker_spec
from batch_ingest.source_store import SourceStore
from tests.faults import InjectedFailure, failing_after
from tests.integration import test_reindex as base
from tests.integration.test_audit_postgres import postgres_url

pytestmark = pytest.mark.integration

team = base.team  # the fixture: a fresh team id
documents, ingest_old, expected_chunks = base.documents, base.ingest_old, base.expected_chunks


@pytest.fixture(params=["sqlite", "postgres"])
def state_settings(request, settings, tmp_path):
    """The settings with the job rows (and the source registry) on SQLite or PostgreSQL."""
    url = f"sqlite:///{tmp_path}/s.db" if request.param == "sqlite" else postgres_url()
    return settings.model_copy(update={"state": settings.state.model_copy(update={"url": url})})


def reindexer(job_settings, store, embedder, sources, **kw: Any) -> Reindexer:
    """A Reindexer whose in-process worker shares the session's loaded model."""
    spec = worker_spec(job_settings)

    def local_worker(physical: str, check: bool) -> ReindexWorker:
        return ReindexWorker(
            spec,
            physical,
            check,
            versions=store.versions,
            embed=lambda texts: embedder.core.embed(texts, "passage"),
        )

    return Reindexer(
        job_settings, versions=store.versions, sources=sources, worker_factory=local_worker, **kw
    )


def local(team_id: str, **kw: Any) -> ReindexOptions:
    return ReindexOptions(team_id=team_id, engine="local", batch_size=2, clock_skew_s=0, **kw)


def cli_settings(job_settings) -> list[str]:
    """CLI flags that give the CLI the test's Milvus collection base and state database."""
    sections = {name: getattr(job_settings, name).model_dump() for name in ("milvus", "state")}
    return ["--settings-json", json.dumps(sections)]


def age_heartbeat(state: ReindexState, job_id: str, seconds: float) -> None:
    """The row as a driver killed ``seconds`` ago left it: running, heartbeat that old."""
    job = state.get(job_id)
    assert job is not None
    job.move_to(JobStatus.RUNNING)
    job.eta_s = 42.0
    state.save(job)
    old = datetime.now(UTC) - timedelta(seconds=seconds)
    with state.engine.begin() as conn:
        conn.execute(
            sa.update(state.jobs)
            .where(state.jobs.c.job_id == job_id)
            .values(heartbeat_at=old, updated_at=old)
        )


async def crashed_job(state_settings, store, embedder, team_id: str):
    """A team ingested as v1 and a reindex that crashed after 4 recorded documents: its
    half-built v2 is there, the alias still on v1."""
    docs = documents(team_id, 8)
    sources = await ingest_old(state_settings, store, embedder, docs)
    with pytest.raises(InjectedFailure):
        reindexer(state_settings, store, embedder, sources, wrap_sink=failing_after(4)).run(
            local(team_id)
        )
    state = ReindexState(sources.engine)
    [job] = state.unfinished(team_id)
    assert job.status == "failed" and job.target_version == 2
    assert store.versions.existing(team_id) == [1, 2]
    return docs, sources, state, job


async def test_an_unknown_team_is_refused_and_leaves_no_collection(
    job_settings, store, embedder, team, capsys
):
    sources = SourceStore(job_settings.state.url)
    with pytest.raises(UnknownTeam, match=f"team {team!r} has no documents"):
        reindexer(job_settings, store, embedder, sources).run(local(team))
    # By CLI (its own Milvus connection) and as POST /admin/reindex submits it.
    argv = ["--team", team, "--engine", "local", *cli_settings(job_settings)]
    assert cli.main(argv) == 1
    assert f"team {team!r} has no documents in the source registry" in capsys.readouterr().err
    jobs = ReindexJobs(job_settings, versions=store.versions)
    with pytest.raises(UnknownTeam) as refused:
        jobs.submit(team, "op")
    assert refused.value.status_code == 404
    assert ReindexState(sources.engine).latest(team) is None
    assert store.versions.existing(team) == [] and store.versions.current(team) is None
    assert not store.conn.call("has collection", "has_collection", store.collection_for(team))


async def test_allow_empty_builds_an_empty_collection_on_purpose(
    job_settings, store, embedder, team
):
    sources = SourceStore(job_settings.state.url)
    result = reindexer(job_settings, store, embedder, sources).run(local(team, allow_empty=True))
    assert result.job.status == "succeeded"
    assert store.versions.current(team) == 1
    assert store.versions.count(store.versions.name(team, 1)) == 0
    assert result.job.total_docs == result.job.rows_in_target == 0


async def test_a_job_whose_heartbeat_stopped_reads_as_stalled_and_resumes(
    state_settings, store, embedder, team, capsys
):
    docs, sources, state, job = await crashed_job(state_settings, store, embedder, team)
    age_heartbeat(state, job.job_id, 300)  # killed 5 minutes ago
    shown = ReindexJobs(state_settings, state).get(job.job_id)
    assert shown.status == "stalled" and shown.eta_s is None
    assert "no heartbeat since" in shown.note and "--resume" in shown.note
    assert state.get(job.job_id).status == "running"  # shown, not stored
    argv = ["--team", team, "--status", *cli_settings(state_settings)]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["job"]["status"] == "stalled"

    result = reindexer(state_settings, store, embedder, sources).run(local(team, resume=True))
    assert result.job.job_id == job.job_id and result.job.status == "succeeded"
    n = expected_chunks(state_settings, docs)
    assert result.job.rows_in_target == store.count(team) == n
    assert store.versions.current(team) == 2 and store.versions.existing(team) == [2]


async def test_resume_is_refused_while_the_heartbeat_is_fresh(
    state_settings, store, embedder, team
):
    _, sources, state, job = await crashed_job(state_settings, store, embedder, team)
    age_heartbeat(state, job.job_id, 2)  # its driver beat 2 s ago: alive
    with pytest.raises(ReindexError, match="driver is alive"):
        reindexer(state_settings, store, embedder, sources).run(local(team, resume=True))
    with pytest.raises(ReindexError, match="alive"):
        reindexer(state_settings, store, embedder, sources).run(local(team))
    row = state.get(job.job_id)
    assert row.status == "running" and row.target_version == 2
    assert store.versions.existing(team) == [1, 2]  # nothing was dropped or rebuilt
    assert ReindexJobs(state_settings, state).get(job.job_id).status == "running"


async def test_clean_up_drops_a_failed_jobs_target_never_the_live_version(
    job_settings, store, embedder, team, capsys
):
    _, _, state, job = await crashed_job(job_settings, store, embedder, team)
    argv = ["--team", team, "--clean-up", *cli_settings(job_settings)]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["superseded"] == [job.job_id] and report["dropped_versions"] == [2]
    assert report["live_version"] == 1 and report["left_alone"] == []
    assert store.versions.existing(team) == [1] and store.versions.current(team) == 1
    assert state.get(job.job_id).status == "superseded" and state.unfinished(team) == []
    assert store.count(team) > 0  # the live version still answers


async def test_counts_after_catch_up_deletes_equal_what_is_live(
    job_settings, store, embedder, team, monkeypatch
):
    docs = documents(team, 8)
    sources = await ingest_old(job_settings, store, embedder, docs)
    job_runner = reindexer(job_settings, store, embedder, sources)
    real_process, real_flush = job_runner._process, store.versions.flush
    bulk_done = [False]

    def process_then_delete(*args: Any, **kw: Any) -> None:
        real_process(*args, **kw)
        if not bulk_done[0]:  # deleted while the bulk pass ran: the first catch-up
            bulk_done[0] = True
            sources.tombstone((team, "doc", "doc001"))

    def flush_then_delete(physical: str) -> None:
        real_flush(physical)
        if bulk_done[0] and sources.count(team) == 7:
            # Deleted while the job verified its target (rows counted with them): the last
            # catch-up, before the switch, takes them out.
            sources.tombstone((team, "doc", "doc002"))
            sources.tombstone((team, "doc", "doc003"))

    job_runner._process = process_then_delete  # type: ignore[method-assign]
    monkeypatch.setattr(store.versions, "flush", flush_then_delete)
    job = job_runner.run(local(team)).job
    live = [d for d in docs if d.doc_id not in ("doc001", "doc002", "doc003")]
    n = expected_chunks(job_settings, live)
    physical = store.versions.name(team, 2)
    real_flush(physical)
    assert job.rows_in_target == store.versions.count(physical) == n
    assert job.total_docs == job.done_docs == sources.count(team) == len(live)
    row = ReindexState(sources.engine).get(job.job_id)
    assert (row.rows_in_target, row.total_docs) == (n, len(live))
