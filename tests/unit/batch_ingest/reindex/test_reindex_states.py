"""Honest reindex job states (issue 33): liveness from a heartbeat, ``stalled`` for a dead
driver, no second driver on one job, an unknown team refused, half-built targets dropped
(``--clean-up``) and counts that match what is live.
State on SQLite, versions in memory (``FakeVersions``), no Ray, no Milvus."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from batch_ingest.reindex import Reindexer, ReindexError, ReindexOptions, cli, launcher
from batch_ingest.reindex.cleanup import clean_up, unresumable
from batch_ingest.reindex.heartbeat import Heartbeat
from batch_ingest.reindex.liveness import is_alive, present
from batch_ingest.reindex.options import VerificationFailed
from batch_ingest.reindex.state import IllegalTransition, JobStatus, ReindexJob, ReindexState
from batch_ingest.reindex.team import UnknownTeam
from batch_ingest.reindex.worker import ReindexWorker, worker_spec
from batch_ingest.settings import ReindexSettings
from batch_ingest.source_store import SourceStore
from serve_app.testing import claims, mint
from tests.faults import InjectedFailure, failing_after
from tests.unit.batch_ingest.reindex import test_reindex as base

TEAM = base.TEAM
doc, options = base.doc, base.options
env = base.env  # the fixture: settings, sources, FakeVersions, a counting embedder, make()
admin = base.admin  # the fixture: a gateway app with FakeJobs, audited decisions captured
BOUND = ReindexSettings().stale_after_s


def state_of(env) -> ReindexState:
    return ReindexState(env.sources.engine)


def age_row(state: ReindexState, job_id: str, heartbeat_s: float | None, updated_s: float = 600):
    """Make a job's heartbeat (``None``: none) and last update that many seconds old."""
    now = datetime.now(UTC)
    beat = None if heartbeat_s is None else now - timedelta(seconds=heartbeat_s)
    with state.engine.begin() as conn:
        conn.execute(
            sa.update(state.jobs)
            .where(state.jobs.c.job_id == job_id)
            .values(heartbeat_at=beat, updated_at=now - timedelta(seconds=updated_s))
        )


def running_job(
    state: ReindexState, heartbeat_s: float | None, updated_s: float = 600, **fields: Any
) -> ReindexJob:
    """A job row as a driver left it: running, with progress and an ETA, its heartbeat
    (``None``: none) and last update that many seconds old."""
    job = state.create(TEAM)
    job.move_to(JobStatus.RUNNING)
    job.total_docs, job.done_docs, job.eta_s, job.rate_chunks_s = 10, 4, 12.0, 3.5
    for key, value in fields.items():
        setattr(job, key, value)
    state.save(job)
    age_row(state, job.job_id, heartbeat_s, updated_s)
    return state.get(job.job_id)  # type: ignore[return-value]


def with_live_v1(env) -> None:
    env.versions.create(TEAM, 1)
    env.versions.switch(TEAM, 1)


# --- the heartbeat column and its writer ------------------------------------------------------


def test_a_database_made_before_heartbeats_gets_the_heartbeat_at_column(tmp_path):
    engine = SourceStore(f"sqlite:///{tmp_path}/old.db").engine
    ReindexState(engine).create(TEAM)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE reindex_jobs DROP COLUMN heartbeat_at"))
    state = ReindexState(engine)  # an upgraded gateway opens the old database
    [job] = state.unfinished(TEAM)
    assert job.heartbeat_at is None
    assert state.beat(job.job_id, None) is not None
    assert state.get(job.job_id).heartbeat_at is not None


def test_save_leaves_the_heartbeat_to_beat_and_stalled_is_never_stored(env):
    state = state_of(env)
    job = state.create(TEAM)
    written = state.beat(job.job_id, None)
    job.heartbeat_at = None  # a stale copy in the driver's hands
    job.done_docs = 3
    state.save(job)
    assert state.get(job.job_id).heartbeat_at == written
    with pytest.raises(IllegalTransition, match="never stored"):
        state.save(ReindexJob(job_id=job.job_id, team_id=TEAM, status=JobStatus.STALLED))


def test_of_two_drivers_claiming_one_heartbeat_only_one_wins(env):
    state = state_of(env)
    job = state.create(TEAM)
    first = state.beat(job.job_id, None)
    assert first is not None
    assert state.beat(job.job_id, None) is None  # the second saw the same "no heartbeat"
    assert state.beat(job.job_id, first) is not None  # the owner goes on


def test_heartbeat_beats_on_its_own_thread_while_the_job_makes_no_progress(env):
    state = state_of(env)
    job = state.create(TEAM)
    with Heartbeat(state, job, every_s=0.05):
        first = state.get(job.job_id).heartbeat_at
        time.sleep(0.4)  # the model loading, a long batch: no progress, no save
        later = state.get(job.job_id).heartbeat_at
    assert first is not None and later is not None and later > first
    stopped = state.get(job.job_id).heartbeat_at
    time.sleep(0.2)
    assert state.get(job.job_id).heartbeat_at == stopped  # it stops with the block


def test_heartbeat_stops_when_another_driver_took_the_job_over(env):
    state = state_of(env)
    job = state.create(TEAM)
    with Heartbeat(state, job, every_s=0.05) as beating:
        # A --resume elsewhere: read the beat, then replace it if unchanged; this driver's
        # own beat may land in between (every 50 ms), as it would for a real resume.
        for _ in range(100):
            other = state.get(job.job_id)
            if state.beat(job.job_id, other.heartbeat_at) is not None:
                break
        else:
            pytest.fail("the job could not be taken over in 100 tries")
        time.sleep(0.3)
        assert beating.lost


def test_a_job_beats_during_a_single_long_batch(env):
    env.sources.put([doc(i) for i in range(3)])
    state = state_of(env)
    seen: list[datetime | None] = []

    def slow_embed(texts):
        job = state.latest(TEAM)
        seen.append(job.heartbeat_at)
        time.sleep(0.4)  # one slow batch: no progress is saved meanwhile
        seen.append(state.get(job.job_id).heartbeat_at)
        return env.embed(texts)

    spec = worker_spec(env.settings)
    reindexer = Reindexer(
        env.settings,
        versions=env.versions,
        sources=env.sources,
        worker_factory=lambda physical, check: ReindexWorker(
            spec, physical, check, versions=env.versions, embed=slow_embed, builder=env.builder
        ),
    )
    opts = replace(options(heartbeat_s=0.05, stale_after_s=1.0), batch_size=10)
    result = reindexer.run(opts)
    assert result.job.status == "succeeded"
    assert seen[0] is not None and seen[1] > seen[0]


# --- stalled: how readers show a dead driver --------------------------------------------------


def test_a_running_job_without_a_heartbeat_for_five_minutes_reads_as_stalled(env):
    state = state_of(env)
    job = running_job(state, heartbeat_s=300)
    jobs = launcher.ReindexJobs(env.settings, state)
    shown = jobs.get(job.job_id)
    assert shown.status == "stalled"
    assert shown.eta_s is None
    assert "no heartbeat since" in shown.note and "(300s ago)" in shown.note
    assert f"--team {TEAM} --resume" in shown.note and "--clean-up" in shown.note
    public = shown.public()
    assert public["status"] == "stalled" and public["eta_s"] is None
    assert public["heartbeat_at"] is not None
    # Shown, not stored: the row still says running (a resume continues it).
    assert state.get(job.job_id).status == "running"


def test_a_fresh_heartbeat_reads_as_running_with_its_eta(env):
    state = state_of(env)
    job = running_job(state, heartbeat_s=2)
    shown = launcher.ReindexJobs(env.settings, state).get(job.job_id)
    assert (shown.status, shown.eta_s) == ("running", 12.0)
    assert is_alive(shown, BOUND)


def test_a_row_from_before_heartbeats_falls_back_to_its_last_update(env):
    state = state_of(env)
    old = running_job(state, heartbeat_s=None, updated_s=300)
    assert present(old, BOUND).status == "stalled"
    recent = running_job(state, heartbeat_s=None, updated_s=5)
    assert present(recent, BOUND).status == "running"


def test_a_switching_job_that_stalled_says_to_resume_it(env):
    state = state_of(env)
    job = running_job(state, heartbeat_s=120, target_version=2)
    job.move_to(JobStatus.SWITCHING)
    state.save(job)
    age_row(state, job.job_id, 120)
    shown = present(state.get(job.job_id), BOUND)
    assert shown.status == "stalled" and "switching" in shown.note and "--resume" in shown.note


def test_the_cli_status_shows_a_dead_job_as_stalled(env, capsys):
    state = state_of(env)
    running_job(state, heartbeat_s=300)
    url = env.settings.state.url
    assert cli.main(["--team", TEAM, "--state-url", url, "--status"]) == 0
    shown = json.loads(capsys.readouterr().out)["job"]
    assert shown["status"] == "stalled" and shown["eta_s"] is None
    assert cli.main(["--team", "nobody", "--state-url", url, "--status"]) == 0
    assert json.loads(capsys.readouterr().out)["job"] is None


def test_a_crashed_ray_task_makes_the_job_failed_in_its_row(env, monkeypatch):
    import ray

    state = state_of(env)
    job = running_job(state, heartbeat_s=1)  # it crashed a moment ago: heartbeat still fresh

    class WorkerCrashedError(Exception):
        pass

    def get(ref):
        raise WorkerCrashedError("the worker died unexpectedly")

    task = object()
    monkeypatch.setattr(ray, "wait", lambda refs, timeout: ([task], []))
    monkeypatch.setattr(ray, "get", get)
    jobs = launcher.ReindexJobs(env.settings, state)
    jobs._tasks[job.job_id] = task
    shown = jobs.get(job.job_id)
    assert shown.status == "failed"
    assert "WorkerCrashedError: the worker died unexpectedly" in shown.error
    row = state.get(job.job_id)
    assert row.status == "failed" and row.error == shown.error and row.finished_at
    assert row.eta_s is None


def test_a_runner_that_recorded_its_end_before_exiting_keeps_it(env):
    state = state_of(env)
    job = running_job(state, heartbeat_s=1)

    class Exited(subprocess.Popen):
        def __init__(self) -> None:  # no process: its end is simulated
            self._child_created, self.returncode = False, None

        def poll(self):
            done = state.get(job.job_id)  # it wrote "succeeded", then exited
            done.move_to(JobStatus.SUCCEEDED)
            state.save(done)
            self.returncode = 0
            return 0

    jobs = launcher.ReindexJobs(env.settings, state)
    jobs._tasks[job.job_id] = Exited()
    assert jobs.get(job.job_id).status == "succeeded"
    assert state.get(job.job_id).error is None


def test_a_stalled_job_does_not_block_a_new_submission(env, monkeypatch):
    monkeypatch.setattr(launcher.ReindexJobs, "_start", lambda self, runner, job: None)
    env.sources.put([doc(1)])
    state = state_of(env)
    alive = running_job(state, heartbeat_s=2)

    def no_milvus(self):
        raise AssertionError("a team with documents is known without opening Milvus")

    monkeypatch.setattr(launcher.ReindexJobs, "versions", property(no_milvus))
    jobs = launcher.ReindexJobs(env.settings, state, sources=env.sources)
    with pytest.raises(launcher.Conflict, match=alive.job_id):
        jobs.submit(TEAM, "op")
    age_row(state, alive.job_id, 300)
    assert jobs.submit(TEAM, "op").status == "queued"


# --- no second driver -------------------------------------------------------------------------


def test_resume_is_refused_while_the_driver_is_alive_and_allowed_once_it_is_stale(env):
    docs = [doc(i) for i in range(6)]
    env.sources.put(docs)
    with pytest.raises(InjectedFailure):
        env.make(wrap_sink=failing_after(3)).run(options())
    state = state_of(env)
    [job] = state.unfinished(TEAM)
    # As a killed driver leaves it: running, heartbeat fresh (it died a second ago).
    job.move_to(JobStatus.RUNNING)
    state.save(job)
    age_row(state, job.job_id, heartbeat_s=1)
    with pytest.raises(ReindexError, match="driver is alive") as refused:
        env.make().run(options(resume=True))
    assert job.job_id in str(refused.value) and f"{BOUND:g}s" in str(refused.value)
    with pytest.raises(ReindexError, match="driver is alive"):
        env.make().run(options(job_id=job.job_id))
    assert state.get(job.job_id).status == "running"  # the refusal changed nothing
    age_row(state, job.job_id, heartbeat_s=300)
    result = env.make().run(options(resume=True))
    assert result.job.job_id == job.job_id and result.job.status == "succeeded"
    assert len(env.versions.live_rows()) == base.expected_chunks(env, docs)


def test_the_runner_takes_a_queued_job_nobody_has_started(env):
    env.sources.put([doc(1)])
    state = state_of(env)
    queued = state.create(TEAM, {"runner": "subprocess"})  # as POST /admin/reindex made it
    result = env.make().run(options(job_id=queued.job_id))
    assert result.job.job_id == queued.job_id and result.job.status == "succeeded"
    assert state.get(queued.job_id).heartbeat_at is not None


def test_a_finished_job_cannot_be_run_again_by_its_id(env):
    env.sources.put([doc(1)])
    done = env.make().run(options()).job
    with pytest.raises(ReindexError, match="succeeded: nothing to run"):
        env.make().run(options(job_id=done.job_id))


def test_a_stalled_job_is_superseded_by_a_new_run_and_its_target_dropped(env):
    env.sources.put([doc(i) for i in range(4)])
    with_live_v1(env)
    state = state_of(env)
    dead = running_job(state, heartbeat_s=300, source_version=1, target_version=2)
    env.versions.create(TEAM, 2)
    result = env.make().run(options())
    assert state.get(dead.job_id).status == "superseded"
    assert result.job.target_version == 2  # v2 was dropped and rebuilt
    assert env.versions.existing(TEAM) == [2] and env.versions.current(TEAM) == 2


# --- an unknown team --------------------------------------------------------------------------


def test_an_unknown_team_is_refused_before_any_job_or_collection(env):
    state = state_of(env)
    with pytest.raises(UnknownTeam) as refused:
        env.make().run(options())
    message = str(refused.value)
    assert repr(TEAM) in message and "no documents in the source registry" in message
    assert "no collection" in message and "--allow-empty" in message
    assert state.latest(TEAM) is None
    assert env.versions.existing(TEAM) == [] and env.versions.current(TEAM) is None


def test_allow_empty_builds_an_empty_team_on_purpose(env):
    result = env.make().run(options(allow_empty=True))
    assert result.job.status == "succeeded"
    assert env.versions.current(TEAM) == 1 and env.versions.live_rows() == {}
    assert result.job.total_docs == result.job.rows_in_target == 0


def test_a_team_whose_documents_were_all_deleted_is_not_unknown(env):
    env.sources.put([doc(1)])
    assert env.make().run(options()).job.status == "succeeded"
    env.sources.tombstone((TEAM, "doc", "d001"))
    result = env.make().run(options())  # it has its collection: reindexed to empty
    assert result.job.status == "succeeded" and result.job.rows_in_target == 0


def test_the_cli_refuses_an_unknown_team_with_exit_code_1(env, monkeypatch, capsys):
    monkeypatch.setattr(cli, "reindex", lambda settings, opts: env.make().run(opts))
    argv = ["--team", TEAM, "--state-url", env.settings.state.url, "--engine", "local"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"team {TEAM!r} has no documents in the source registry and no collection" in err
    assert cli.main([*argv, "--allow-empty"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "succeeded"


@pytest.fixture
def http_jobs(admin, env, monkeypatch):
    """The admin app with the real ReindexJobs over the env's state and versions; runners
    are not started (a stand-in)."""
    monkeypatch.setattr(launcher.ReindexJobs, "_start", lambda self, runner, job: None)
    settings = env.settings.model_copy(
        update={"reindex": env.settings.reindex.model_copy(update={"runner": "subprocess"})}
    )
    jobs = launcher.ReindexJobs(settings, sources=env.sources, versions=env.versions)
    admin.services.ops.reindex_jobs = jobs
    return jobs


def test_post_for_an_unknown_team_is_404_and_creates_no_job(admin, http_jobs):
    op = mint(claims(sub="op", teams={}, permissions=["admin:reindex"]))
    response = base.call(admin, "POST", "/admin/reindex", op, json={"team_id": TEAM})
    assert response.status_code == 404, response.text
    body = response.json()
    assert body["error"] == "unknown_team"
    assert repr(TEAM) in body["message"] and "no collection" in body["message"]
    assert "allow_empty" in body["hint"]
    assert http_jobs.state.latest(TEAM) is None
    allowed = {"team_id": TEAM, "allow_empty": True}
    response = base.call(admin, "POST", "/admin/reindex", op, json=allowed)
    assert response.status_code == 202, response.text
    assert response.json()["options"]["allow_empty"] is True


def test_get_shows_a_dead_job_as_stalled_over_http(admin, http_jobs):
    job = running_job(http_jobs.state, heartbeat_s=300)
    op = mint(claims(sub="op", teams={}, permissions=["admin:reindex"]))
    body = base.call(admin, "GET", f"/admin/reindex/{job.job_id}", op).json()
    assert body["status"] == "stalled" and body["eta_s"] is None
    assert "--resume" in body["note"]


# --- half-built targets -----------------------------------------------------------------------


def test_a_failed_verification_drops_its_target_and_a_rerun_rebuilds_it(env):
    env.sources.put([doc(i) for i in range(3)])
    with_live_v1(env)
    original = env.versions.upsert

    def old_model(physical, chunks):
        return original(physical, [replace(c, embed_model="old@v0") for c in chunks])

    env.versions.upsert = old_model
    with pytest.raises(ReindexError, match="verification failed"):
        env.make().run(options())
    state = state_of(env)
    [job] = state.unfinished(TEAM)
    assert job.status == "failed" and "its target v2 was dropped" in job.error
    assert env.versions.existing(TEAM) == [1] and env.versions.current(TEAM) == 1
    assert state.done(job.job_id) == {}
    env.versions.upsert = original
    result = env.make().run(options(resume=True))
    assert result.job.status == "succeeded" and result.job.skipped_docs == 0


def test_only_a_failed_verification_drops_the_target(env):
    assert unresumable(VerificationFailed("rows differ"))
    assert not unresumable(ReindexError("gave up waiting for CPUs: the actor pool needs 1"))
    assert not unresumable(ReindexError("verification failed (a plain error)"))
    assert not unresumable(RuntimeError("verification failed"))
    env.sources.put([doc(i) for i in range(4)])
    reindexer = env.make()

    def no_cpus(*args, **kw):
        raise ReindexError("gave up waiting for CPUs: the actor pool needs 1; waited 300s")

    reindexer._process = no_cpus
    with pytest.raises(ReindexError, match="gave up waiting"):
        reindexer.run(options())
    [job] = state_of(env).unfinished(TEAM)
    assert job.status == "failed" and "dropped" not in job.error
    assert env.versions.existing(TEAM) == [1]  # kept for --resume


def test_a_crash_keeps_its_target_for_resume(env):
    env.sources.put([doc(i) for i in range(4)])
    with pytest.raises(InjectedFailure):
        env.make(wrap_sink=failing_after(2)).run(options())
    [job] = state_of(env).unfinished(TEAM)
    assert job.status == "failed" and "dropped" not in job.error
    assert env.versions.existing(TEAM) == [1]


def test_clean_up_drops_dead_jobs_targets_never_the_live_version(env, monkeypatch, capsys):
    env.sources.put([doc(i) for i in range(4)])
    with_live_v1(env)
    with pytest.raises(InjectedFailure):
        env.make(wrap_sink=failing_after(2)).run(options())
    state = state_of(env)
    [failed] = state.unfinished(TEAM)
    env.versions.create(TEAM, 3)  # a version whose drop failed once
    assert env.versions.existing(TEAM) == [1, 2, 3]
    monkeypatch.setattr(cli, "Reindexer", lambda settings: env.make())
    assert cli.main(["--team", TEAM, "--state-url", env.settings.state.url, "--clean-up"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["superseded"] == [failed.job_id]
    assert sorted(report["dropped_versions"]) == [2, 3]
    assert report["live_version"] == 1 and report["left_alone"] == []
    assert env.versions.existing(TEAM) == [1] and env.versions.current(TEAM) == 1
    assert state.get(failed.job_id).status == "superseded"
    assert state.done(failed.job_id) == {}


def test_clean_up_leaves_an_alive_or_switching_job_alone(env):
    with_live_v1(env)
    state = state_of(env)
    alive = running_job(state, heartbeat_s=1, target_version=2)
    env.versions.create(TEAM, 2)
    switching = running_job(state, heartbeat_s=300, target_version=3)
    switching.move_to(JobStatus.SWITCHING)
    state.save(switching)
    age_row(state, switching.job_id, 300)
    env.versions.create(TEAM, 3)
    report = clean_up(state, env.versions, TEAM, BOUND)
    assert report.superseded == [] and report.dropped_versions == []
    assert {j["job_id"] for j in report.left_alone} == {alive.job_id, switching.job_id}
    assert env.versions.existing(TEAM) == [1, 2, 3]
    age_row(state, alive.job_id, 300)
    report = clean_up(state, env.versions, TEAM, BOUND)
    assert report.superseded == [alive.job_id] and report.dropped_versions == [2]


# --- counts that match what is live -----------------------------------------------------------


def test_counts_after_catch_up_deletes_equal_what_is_live(env):
    env.sources.put([doc(i) for i in range(8)])
    with_live_v1(env)
    reindexer = env.make()
    real_process, real_flush = reindexer._process, env.versions.flush
    bulk_done = [False]

    def process_then_delete(*args, **kw):
        real_process(*args, **kw)
        if not bulk_done[0]:  # deleted while the bulk pass ran: the first catch-up
            bulk_done[0] = True
            env.sources.tombstone((TEAM, "doc", "d001"))

    def flush_then_delete(physical):
        real_flush(physical)
        if bulk_done[0] and env.sources.count(TEAM) == 7:
            # Deleted while the job verified its target (rows counted with these): the last
            # catch-up, before the switch, takes them out.
            env.sources.tombstone((TEAM, "doc", "d002"))
            env.sources.tombstone((TEAM, "doc", "d003"))

    reindexer._process = process_then_delete
    env.versions.flush = flush_then_delete
    job = reindexer.run(options()).job
    live = [doc(i) for i in (0, 4, 5, 6, 7)]
    assert job.rows_in_target == len(env.versions.live_rows()) == base.expected_chunks(env, live)
    assert job.expected_chunks == job.rows_in_target
    assert job.total_docs == job.done_docs == env.sources.count(TEAM) == 5
    assert job.public()["progress"] == 1.0
    row = state_of(env).get(job.job_id)
    assert (row.rows_in_target, row.total_docs) == (job.rows_in_target, 5)


# --- settings ---------------------------------------------------------------------------------


def test_the_stale_bound_must_cover_several_heartbeats():
    assert (ReindexSettings().heartbeat_s, ReindexSettings().stale_after_s) == (5.0, 30.0)
    with pytest.raises(ValueError, match="at least 3"):
        ReindexSettings(heartbeat_s=10, stale_after_s=20)
    opts = ReindexOptions.from_settings(TEAM, ReindexSettings(heartbeat_s=2, stale_after_s=9))
    assert (opts.heartbeat_s, opts.stale_after_s) == (2, 9)
