"""Reindex without Ray or Milvus: the job logic (versions, verification, resume, catch-up) over
an in-memory versioned store, the job records, and the admin API's access rules."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from batch_ingest.chunking import Chunker, whitespace_tokens
from batch_ingest.chunks import ChunkBuilder
from batch_ingest.documents import SourceDocument
from batch_ingest.reindex import Reindexer, ReindexError, ReindexOptions
from batch_ingest.reindex.engines import cpu_shortage, resource_shortage
from batch_ingest.reindex.state import IllegalTransition, JobStatus, ReindexJob, ReindexState
from batch_ingest.reindex.worker import ReindexWorker, worker_spec
from batch_ingest.settings import BatchSettings
from batch_ingest.source_store import SourceStore
from deployments.config import EmbedderSettings
from deployments.errors import InvalidInput
from deployments.protocols import ChunkRecord
from serve_app.settings import GatewaySettings
from serve_app.testing import build_gateway, claims, mint
from tests.faults import InjectedFailure, failing_after

TEAM = "dao_re"
# The default embedder's tag (the packaged MiniLM, as settings resolve it on this CPU).
MODEL = EmbedderSettings().embed_model_tag


class FakeVersions:
    """``CollectionVersions`` over dicts: ``{physical name: {chunk_id: row}}``."""

    def __init__(self, team: str = TEAM) -> None:
        self.alias = f"base__{team}"
        self.collections: dict[str, dict[str, ChunkRecord]] = {}
        self.live: str | None = None
        self.switches = 0
        self.shapes: dict[str, dict[str, object]] = {}

    def name(self, team_id: str, version: int) -> str:
        return f"{self.alias}__v{version}"

    def current(self, team_id: str) -> int | None:
        return int(self.live.rsplit("__v", 1)[1]) if self.live else None

    def existing(self, team_id: str) -> list[int]:
        return sorted(int(n.rsplit("__v", 1)[1]) for n in self.collections)

    def create(self, team_id: str, version: int, **shape: object) -> str:
        name = self.name(team_id, version)
        self.collections.setdefault(name, {})
        self.shapes[name] = shape  # dim, embed_model, lexical
        return name

    def upsert(self, physical: str, chunks: list[ChunkRecord]) -> int:
        for c in chunks:
            self.collections[physical][c.chunk_id] = c
        return len(chunks)

    def lookup(self, physical: str, ids: list[str]) -> dict[str, tuple[str, str]]:
        rows = self.collections[physical]
        return {i: (rows[i].content_hash, rows[i].embed_model) for i in ids if i in rows}

    def fetch_rows(self, physical: str, ids: list[str]) -> list[ChunkRecord]:
        rows = self.collections.get(physical, {})
        return [rows[i] for i in ids if i in rows]

    def delete(self, physical: str, ids: list[str]) -> int:
        for i in ids:
            self.collections[physical].pop(i, None)
        return len(ids)

    def count(self, physical: str, expr: str = "") -> int:
        rows = self.collections[physical].values()
        if expr.startswith("embed_model != "):
            tag = json.loads(expr.removeprefix("embed_model != "))
            return sum(1 for r in rows if r.embed_model != tag)
        return len(rows)

    def flush(self, physical: str) -> None:
        pass

    def switch(self, team_id: str, version: int) -> str:
        self.live = self.name(team_id, version)
        self.switches += 1
        return self.live

    def drop(self, team_id: str, version: int) -> bool:
        if version == self.current(team_id):
            raise InvalidInput("live")
        return self.collections.pop(self.name(team_id, version), None) is not None

    def live_rows(self) -> dict[str, ChunkRecord]:
        return self.collections[self.live] if self.live else {}


class CountingEmbed:
    def __init__(self) -> None:
        self.texts = 0

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return np.ones((len(texts), 4), dtype=np.float32)


def doc(i: int, words: int = 120, **kw: Any) -> SourceDocument:
    text = " ".join(f"w{i}_{j}" for j in range(words))
    return SourceDocument(team_id=TEAM, doc_id=f"d{i:03d}", title=f"Doc {i}", text=text, **kw)


@pytest.fixture
def env(tmp_path):
    settings = GatewaySettings(
        milvus={"collection": "base"}, state={"url": f"sqlite:///{tmp_path}/state.db"}
    )
    sources = SourceStore(settings.state.url)
    versions = FakeVersions()
    embed = CountingEmbed()
    builder = ChunkBuilder(Chunker(whitespace_tokens, 50, 5), MODEL)

    def make(**kw: Any) -> Reindexer:
        spec = worker_spec(settings)
        return Reindexer(
            settings,
            versions=versions,
            sources=sources,
            worker_factory=lambda physical, check: ReindexWorker(
                spec, physical, check, versions=versions, embed=embed, builder=builder
            ),
            **kw,
        )

    class Env:
        pass

    e = Env()
    e.settings, e.sources, e.versions, e.embed, e.builder, e.make = (
        settings,
        sources,
        versions,
        embed,
        builder,
        make,
    )
    return e


def options(**kw: Any) -> ReindexOptions:
    return ReindexOptions(
        team_id=TEAM,
        engine="local",
        batch_size=3,
        log_every_s=0,
        clock_skew_s=0,
        **kw,
    )


def expected_chunks(env, docs: list[SourceDocument]) -> int:
    return sum(len(env.builder.build_chunks(d)) for d in docs)


def test_reindex_builds_next_version_verifies_and_swaps(env):
    docs = [doc(i) for i in range(7)]
    env.sources.put(docs)
    env.versions.create(TEAM, 1)
    env.versions.switch(TEAM, 1)
    result = env.make().run(options())
    job = result.job
    assert job.status == "succeeded"
    assert (job.source_version, job.target_version) == (1, 2)
    assert env.versions.current(TEAM) == 2
    assert env.versions.existing(TEAM) == [2]  # the old version is dropped by default
    assert result.dropped_versions == [1]
    n = expected_chunks(env, docs)
    assert job.expected_chunks == job.rows_in_target == len(env.versions.live_rows()) == n
    assert {c.embed_model for c in env.versions.live_rows().values()} == {MODEL}
    assert job.total_docs == job.done_docs == 7
    assert env.embed.texts == n


def test_keep_previous_keeps_exactly_one_version_for_rollback(env):
    env.sources.put([doc(1)])
    for _ in range(3):
        env.make().run(options(keep_previous=True))
    assert env.versions.current(TEAM) == 3
    assert env.versions.existing(TEAM) == [2, 3]


def test_team_without_a_collection_gets_v1_and_its_alias(env):
    env.sources.put([doc(1), doc(2)])
    result = env.make().run(options())
    assert result.job.target_version == 1
    assert env.versions.current(TEAM) == 1


def test_crash_then_resume_continues_into_the_same_version_without_duplicates(env):
    docs = [doc(i) for i in range(10)]
    env.sources.put(docs)
    with pytest.raises(InjectedFailure):
        env.make(wrap_sink=failing_after(6)).run(options())
    state = ReindexState(env.sources.engine)
    [job] = state.unfinished(TEAM)
    assert job.status == "failed" and "injected" in job.error
    assert len(state.done(job.job_id)) == 6
    # The batch after the last recorded one reached Milvus but was not recorded.
    assert env.versions.current(TEAM) is None
    embedded_before = env.embed.texts
    with pytest.raises(ReindexError):
        env.make().run(ReindexOptions(team_id="other", resume=True, engine="local"))
    result = env.make().run(options(resume=True))
    assert result.job.job_id == job.job_id
    assert result.job.target_version == job.target_version == 1
    n = expected_chunks(env, docs)
    assert len(env.versions.live_rows()) == result.job.rows_in_target == n
    # Recorded documents were skipped; the unrecorded batch was found by pk lookup.
    assert env.embed.texts - embedded_before == n - expected_chunks(env, docs[:9])
    assert result.job.skipped_docs == 3
    assert state.unfinished(TEAM) == []


def test_new_run_supersedes_a_dead_job_and_drops_its_half_built_version(env):
    env.sources.put([doc(i) for i in range(4)])
    with pytest.raises(InjectedFailure):
        env.make(wrap_sink=failing_after(2)).run(options())
    assert env.versions.existing(TEAM) == [1]
    dropped = []
    original = env.versions.drop
    env.versions.drop = lambda team, v: dropped.append(v) or original(team, v)
    result = env.make().run(options())
    # The never-live v1 was dropped and rebuilt from scratch (its number is free again).
    assert dropped == [1]
    assert result.job.target_version == 1
    assert env.versions.existing(TEAM) == [1]
    assert len(env.versions.live_rows()) == result.job.rows_in_target
    state = ReindexState(env.sources.engine)
    assert state.unfinished(TEAM) == []


def test_a_fresh_running_job_blocks_a_second_one(env):
    env.sources.put([doc(1)])
    state = ReindexState(env.sources.engine)
    job = state.create(TEAM)
    job.status = "running"
    state.save(job)
    with pytest.raises(ReindexError, match="running"):
        env.make().run(options())


def test_documents_changed_or_deleted_during_the_job_are_caught_up(env):
    docs = [doc(i) for i in range(6)]
    env.sources.put(docs)
    reindexer = env.make()
    real_process = reindexer._process
    calls = [0]

    def process_then_write(*args, **kw):
        real_process(*args, **kw)
        calls[0] += 1
        if calls[0] == 1:  # live ingestion while the bulk pass ran
            env.sources.put([doc(1, words=20), doc(99)])  # d001 shrinks, d099 is new
            env.sources.tombstone((TEAM, "doc", "d002"))

    reindexer._process = process_then_write
    result = reindexer.run(options())
    live = env.versions.live_rows()
    final = [doc(0), doc(1, words=20), doc(3), doc(4), doc(5), doc(99)]
    assert len(live) == result.job.rows_in_target == expected_chunks(env, final)
    assert {c.doc_id for c in live.values()} == {d.doc_id for d in final}


def test_verification_failure_leaves_the_alias_alone(env):
    env.sources.put([doc(i) for i in range(3)])
    env.versions.create(TEAM, 1)
    env.versions.switch(TEAM, 1)
    original = env.versions.upsert

    def old_model(physical, chunks):
        from dataclasses import replace

        return original(physical, [replace(c, embed_model="old@v0") for c in chunks])

    env.versions.upsert = old_model
    with pytest.raises(ReindexError, match="verification failed"):
        env.make().run(options())
    assert env.versions.current(TEAM) == 1
    assert env.versions.switches == 1


def test_shared_layout_is_refused(env):
    settings = env.settings.model_copy(
        update={"milvus": env.settings.milvus.model_copy(update={"layout": "shared"})}
    )
    with pytest.raises(ReindexError, match="collection_per_team"):
        Reindexer(settings, versions=env.versions, sources=env.sources).run(options())


def test_source_store_changed_since_includes_tombstones(tmp_path):
    sources = SourceStore(f"sqlite:///{tmp_path}/s.db")
    sources.put([doc(1), doc(2)])
    mark = datetime.now(UTC)
    assert sources.changed_since(TEAM, mark) == []
    sources.put([doc(3)])
    sources.tombstone((TEAM, "doc", "d001"))
    rows = sources.changed_since(TEAM, mark)
    assert [(r.doc_id, r.deleted) for r in rows] == [("d001", True), ("d003", False)]
    assert len(sources.changed_since(TEAM, mark - timedelta(hours=1))) == 3


def test_job_records_round_trip(tmp_path):
    state = ReindexState(SourceStore(f"sqlite:///{tmp_path}/s.db").engine)
    job = state.create(TEAM, {"actors": 2})
    job.status, job.target_version, job.total_docs, job.done_docs = "running", 3, 10, 4
    state.save(job)
    state.mark_done(job.job_id, {("doc", "a"): 2, ("doc", "b"): 1})
    state.mark_done(job.job_id, {("doc", "a"): 5})
    assert state.done(job.job_id) == {("doc", "a"): 5, ("doc", "b"): 1}
    state.unmark(job.job_id, [("doc", "b")])
    got = state.get(job.job_id)
    assert got.target_version == 3 and got.options == {"actors": 2}
    assert got.public()["progress"] == 0.4
    assert [j.job_id for j in state.unfinished(TEAM)] == [job.job_id]


def test_a_database_made_before_the_note_column_gets_it(tmp_path):
    import sqlalchemy as sa

    engine = SourceStore(f"sqlite:///{tmp_path}/old.db").engine
    ReindexState(engine).create(TEAM)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE reindex_jobs DROP COLUMN note"))
    assert "note" not in {c["name"] for c in sa.inspect(engine).get_columns("reindex_jobs")}
    state = ReindexState(engine)  # an upgraded gateway opens the old database
    [job] = state.unfinished(TEAM)
    assert job.note is None
    job.note = "waiting for CPUs"
    state.save(job)
    assert state.get(job.job_id).note == "waiting for CPUs"


def test_cpu_shortage_names_what_the_pool_needs_and_what_is_free():
    assert cpu_shortage(1.0, 1.0, 2.0) is None
    busy = cpu_shortage(1.0, 0.5, 2.0)
    assert busy is not None and "needs 1" in busy and "0.5 of the cluster's 2 are free" in busy
    never = cpu_shortage(4.0, 2.0, 2.0)
    assert never is not None and "whole cluster has 2" in never


def test_resource_shortage_names_the_custom_resource_and_how_to_offer_it():
    assert resource_shortage({}, {}, {}) is None
    assert resource_shortage({"reindex": 2.0}, {"reindex": 2.0}, {"reindex": 4.0}) is None
    absent = resource_shortage({"reindex": 1.0}, {"CPU": 4.0}, {"CPU": 4.0})
    assert absent is not None and "'reindex'" in absent
    assert "ray start --resources '{\"reindex\": N}'" in absent
    held = resource_shortage({"reindex": 2.0}, {"reindex": 1.0}, {"reindex": 2.0})
    assert held is not None and "1 of 2 are free" in held


def test_actor_resources_come_from_settings_and_the_command_line(monkeypatch):
    import argparse

    from batch_ingest.reindex.cli import parse_resources
    from batch_ingest.settings import ReindexSettings

    monkeypatch.setenv("REINDEX__ACTOR_RESOURCES", '{"rag_worker": 1}')
    cfg = BatchSettings().reindex
    assert cfg.actor_resources == {"rag_worker": 1.0}
    assert ReindexOptions.from_settings("t", cfg).actor_resources == {"rag_worker": 1.0}
    given = parse_resources(argparse.ArgumentParser(), ["gpu_pool=0.5", "zone_a=1"])
    assert given == {"gpu_pool": 0.5, "zone_a": 1.0}
    options = ReindexOptions.from_settings("t", ReindexSettings(), actor_resources=given)
    assert options.actor_resources == given
    assert parse_resources(argparse.ArgumentParser(), None) is None
    for bad in ("gpu_pool", "=1", "gpu_pool=0", "gpu_pool=many"):
        with pytest.raises(SystemExit):
            parse_resources(argparse.ArgumentParser(), [bad])


# --- admin API ---------------------------------------------------------------------------


class FakeJobs:
    def __init__(self, tmp_path) -> None:
        self.state = ReindexState(SourceStore(f"sqlite:///{tmp_path}/jobs.db").engine)
        self.submitted: list[str] = []

    def submit(self, team_id: str, submitted_by: str, allow_empty: bool = False):
        self.submitted.append(team_id)
        return self.state.create(team_id, {"submitted_by": submitted_by})

    def get(self, job_id: str):
        return self.state.get(job_id)


@pytest.fixture
def admin(tmp_path, clean_gateway_env):
    gw = build_gateway()
    gw.services.ops.reindex_jobs = FakeJobs(tmp_path)
    audited: list[dict[str, Any]] = []
    original = gw.services.recorder.decision

    def capture(trace_id, principal, started=None, **fields):
        audited.append(fields)
        original(trace_id, principal, started, **fields)

    gw.services.recorder.decision = capture
    gw.audited = audited
    return gw


def call(gw, method: str, path: str, token: str, **kw):
    return gw.client.request(method, path, headers={"authorization": f"Bearer {token}"}, **kw)


def test_member_gets_403_and_the_deny_is_audited(admin):
    member = mint(claims(teams={"dao_a": ["member"]}))
    response = call(admin, "POST", "/admin/reindex", member, json={"team_id": "dao_a"})
    assert response.status_code == 403
    assert response.json()["reason"] == "reindex_not_granted"
    assert admin.services.ops.reindex_jobs.submitted == []
    assert admin.audited[-1]["decision"] == "deny"
    assert admin.audited[-1]["action"] == "admin.reindex"


def test_team_owner_may_reindex_its_own_team_only(admin):
    owner = mint(claims(sub="olga", teams={"dao_a": ["owner"]}))
    response = call(admin, "POST", "/admin/reindex", owner, json={"team_id": "dao_a"})
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    assert response.json()["status"] == "queued"
    assert admin.audited[-1]["decision"] == "allow"
    assert admin.audited[-1]["reason"] == "team_admin_role"
    status = call(admin, "GET", f"/admin/reindex/{job_id}", owner)
    assert status.status_code == 200
    assert status.json()["team_id"] == "dao_a"
    other = call(admin, "POST", "/admin/reindex", owner, json={"dao_id": "dao_b"})
    assert other.status_code == 403
    # A job of another team is not readable by this owner.
    op = mint(claims(sub="op", teams={}, permissions=["admin:reindex"]))
    b_job = call(admin, "POST", "/admin/reindex", op, json={"team_id": "dao_b"}).json()["job_id"]
    assert call(admin, "GET", f"/admin/reindex/{b_job}", owner).status_code == 403
    assert call(admin, "GET", f"/admin/reindex/{b_job}", op).status_code == 200


def test_unknown_job_is_404_for_admins_and_403_otherwise(admin):
    op = mint(claims(sub="op", teams={}, permissions=["admin:reindex"]))
    owner = mint(claims(teams={"dao_a": ["owner"]}))
    assert call(admin, "GET", "/admin/reindex/nope", op).status_code == 404
    assert call(admin, "GET", "/admin/reindex/nope", owner).status_code == 403


def test_body_is_validated(admin):
    op = mint(claims(sub="op", teams={}, permissions=["admin:reindex"]))
    assert call(admin, "POST", "/admin/reindex", op, json={}).status_code == 422
    bad = {"team_id": "a", "extra": 1}
    assert call(admin, "POST", "/admin/reindex", op, json=bad).status_code == 422
    assert admin.client.post("/admin/reindex", json={"team_id": "a"}).status_code == 401


def test_jobs_start_the_cli_as_a_subprocess_and_refuse_a_second_active_job(tmp_path, monkeypatch):
    import io
    import subprocess

    from batch_ingest.reindex import launcher

    started: list[dict[str, Any]] = []

    class Stdin(io.BytesIO):
        def close(self) -> None:
            started[-1]["stdin"] = self.getvalue()
            super().close()

    class FakePopen:
        returncode: int | None = None  # running

        def __init__(self, cmd, **kw):
            started.append({"cmd": cmd, **kw, "process": self})
            self.stdin = Stdin()

        def poll(self):
            return self.returncode

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setattr(launcher, "ROOT", tmp_path)  # its log goes to ROOT/var/reindex
    settings = GatewaySettings(
        state={"url": f"sqlite:///{tmp_path}/s.db"}, reindex={"runner": "subprocess"}
    )
    SourceStore(settings.state.url).put([doc(1).model_copy(update={"team_id": "dao_a"})])
    jobs = launcher.ReindexJobs(settings)
    job = jobs.submit("dao_a", "op")
    [run] = started
    assert run["cmd"][-5:] == ["--team", "dao_a", "--job-id", job.job_id, "--settings-stdin"]
    # The settings sections travel on the child's standard input, not argv or environment.
    sent = json.loads(run["stdin"])
    assert set(sent) == set(launcher.JOB_SECTIONS)
    assert sent["state"]["url"].endswith("s.db")
    assert "env" not in run and "s.db" not in " ".join(run["cmd"])
    with pytest.raises(launcher.Conflict):
        jobs.submit("dao_a", "op")
    # The process died before it wrote anything: the job is failed, in its row too.
    run["process"].returncode = 3
    seen = jobs.get(job.job_id)
    assert seen.status == "failed" and "exited with status 3" in seen.error
    assert jobs.state.get(job.job_id).status == "failed"
    assert jobs.submit("dao_a", "op").job_id != job.job_id  # no longer in the way


def test_the_cli_reads_its_settings_from_standard_input(monkeypatch, capsys):
    import io

    from batch_ingest.reindex import cli
    from batch_ingest.reindex.options import ReindexResult

    seen: dict[str, Any] = {}

    def fake_reindex(settings, options):
        seen.update(settings=settings, options=options)
        return ReindexResult(job=ReindexJob(job_id="j9", team_id=options.team_id))

    monkeypatch.setattr(cli, "reindex", fake_reindex)
    body = {"milvus": {"uri": "http://milvus.example:19530"}, "reindex": {"actors": 3}}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(body)))
    assert cli.main(["--team", "dao_a", "--job-id", "j9", "--settings-stdin"]) == 0
    assert seen["settings"].milvus.uri == "http://milvus.example:19530"
    assert (seen["options"].actors, seen["options"].job_id) == (3, "j9")
    assert json.loads(capsys.readouterr().out)["job_id"] == "j9"


def test_crash_after_the_switch_resumes_into_the_clean_up(env):
    env.sources.put([doc(1), doc(2)])
    env.versions.create(TEAM, 1)
    env.versions.switch(TEAM, 1)
    original = env.versions.drop

    def broken(team, version):
        raise RuntimeError("milvus went away")

    env.versions.drop = broken
    with pytest.raises(RuntimeError):
        env.make().run(options())
    assert env.versions.current(TEAM) == 2 and env.versions.existing(TEAM) == [1, 2]
    env.versions.drop = original
    embedded = env.embed.texts
    result = env.make().run(options(resume=True))
    assert result.job.status == "succeeded"
    assert env.versions.existing(TEAM) == [2]
    assert env.embed.texts == embedded  # nothing re-embedded


def test_job_status_moves_only_along_its_transitions():
    job = ReindexJob(job_id="j1", team_id=TEAM)
    assert job.status is JobStatus.QUEUED and not job.finished
    for status in (JobStatus.RUNNING, JobStatus.FAILED, JobStatus.RUNNING, JobStatus.SWITCHING):
        job.move_to(status)
    job.move_to(JobStatus.SUCCEEDED)
    assert job.finished and job.error is None
    with pytest.raises(IllegalTransition, match="succeeded → running"):
        job.move_to(JobStatus.RUNNING)
    queued = ReindexJob(job_id="j2", team_id=TEAM, status="queued")  # as read from the table
    with pytest.raises(IllegalTransition):
        queued.move_to(JobStatus.SWITCHING)
    queued.move_to(JobStatus.SUPERSEDED, "superseded by a newer job")
    assert (queued.status, queued.error) == ("superseded", "superseded by a newer job")


def test_options_default_to_the_reindex_settings_and_given_values_win():
    from batch_ingest.settings import ReindexSettings

    cfg = ReindexSettings(actors=3, batch_size=40, keep_previous=True)
    opts = ReindexOptions.from_settings(TEAM, cfg, batch_size=None, actors=2)
    assert (opts.actors, opts.batch_size, opts.keep_previous) == (2, 40, True)
    assert ReindexOptions(team_id=TEAM).batch_size == ReindexSettings().batch_size


def test_reindex_records_its_embedded_tokens_in_the_ledger(env):
    from batch_ingest.usage import EmbeddingUsage

    docs = [doc(i) for i in range(4)]
    env.sources.put(docs)
    env.versions.create(TEAM, 1)
    env.versions.switch(TEAM, 1)
    assert env.make().run(options()).job.status == "succeeded"
    chunks = [c for d in docs for c in env.builder.build_chunks(d)]
    (row,) = EmbeddingUsage(env.sources.engine).rows(TEAM)
    assert (row.source, row.chunks) == ("reindex", len(chunks))
    assert row.tokens == sum(whitespace_tokens(c.text) for c in chunks)


@pytest.mark.parametrize(("configured", "expected"), [(0, os.cpu_count() or 1), (1, 1), (3, 3)])
def test_the_embedding_workers_use_the_configured_torch_threads(configured, expected):
    """reindex.torch_threads: 0 (the default) is every core of the worker's node."""
    settings = GatewaySettings(reindex={"torch_threads": configured})
    worker = ReindexWorker(
        worker_spec(settings),
        "p",
        False,
        versions=FakeVersions(),
        embed=CountingEmbed(),
        builder=ChunkBuilder(Chunker(whitespace_tokens, 50, 5), MODEL),
    )
    assert worker.settings.torch_threads == expected


def test_a_pool_worker_runs_at_a_lower_cpu_priority():
    """reindex.nice: the pool's worker process (here a child process) lowers the priority
    of all its threads, searches keep theirs."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        before, after = pool.apply(_priority_after, (5,))
    assert after == min(19, before + 5)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # this process untouched


def _priority_after(nice: int) -> tuple[int, int]:
    import threading

    from deployments.priority import lower_priority

    before = os.getpriority(os.PRIO_PROCESS, 0)
    started = threading.Event()
    threading.Thread(target=started.wait, daemon=True).start()  # a thread that exists already
    reached = lower_priority(nice)
    seen = set()
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            seen.add(os.getpriority(os.PRIO_PROCESS, tid))
        except ProcessLookupError:  # a thread of the pool that ended meanwhile
            continue
    assert seen == {reached}
    started.set()
    return before, reached


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_idle_policy_covers_every_thread_of_the_worker_only():
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        policies, nice_before, nice_after = pool.apply(_policies_after_idle)
    assert policies == {os.SCHED_IDLE}
    assert nice_after == nice_before  # nice 0 asked: only the policy changed
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # this process untouched


def _policies_after_idle() -> tuple[set[int], int, int]:
    import threading

    from deployments.priority import is_idle_policy, lower_priority

    before = os.getpriority(os.PRIO_PROCESS, 0)
    started = threading.Event()
    threading.Thread(target=started.wait, daemon=True).start()  # a thread that exists already
    reached = lower_priority(0, idle=True)
    later: list[int] = []
    thread = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))
    thread.start()  # a thread started afterwards inherits the policy
    thread.join()
    policies = set(later)
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            policies.add(os.sched_getscheduler(tid))
        except ProcessLookupError:  # a thread of the pool that ended meanwhile
            continue
    assert is_idle_policy()
    started.set()
    return policies, before, reached


def test_the_driver_task_passes_its_priority_to_the_job():
    """The admin API's Ray task (entry.run_low_priority_job): the job lowers the driver's
    priority by reindex.nice once it starts an actor pool (ReindexOptions.driver_nice); a
    copy keeps it. In a child process: the entry imports nothing heavy first."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        seen = pool.apply(_entry_call, (3,))
    assert seen == {"job_id": "j1", "team_id": "t1", "overrides": {"reindex": {}}, "nice": 3}


def test_the_entry_modules_import_nothing_heavy():
    """What a Ray worker imports to find the task or the pool's class, before either can
    lower its priority."""
    import subprocess
    import sys

    code = (
        "import sys, batch_ingest.reindex.entry, batch_ingest.reindex.pool; "
        "print([m for m in ('torch', 'pymilvus', 'ray', 'sqlalchemy', 'transformers') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _entry_call(nice: int) -> dict[str, Any]:
    from batch_ingest.reindex import entry, job

    seen: dict[str, Any] = {}

    def fake_run_job(job_id, team_id, overrides, driver_nice=0) -> dict:
        seen.update(job_id=job_id, team_id=team_id, overrides=overrides, nice=driver_nice)
        return {}

    job.run_job = fake_run_job  # type: ignore[assignment]  # this child process only
    entry.run_low_priority_job("j1", "t1", {"reindex": {}}, nice)
    return seen


def test_a_job_options_carry_the_drivers_nice():
    from batch_ingest.reindex.options import ReindexOptions
    from batch_ingest.settings import ReindexSettings

    assert ReindexOptions.from_settings("t", ReindexSettings()).driver_nice == 0
    assert ReindexOptions.from_settings("t", ReindexSettings(), driver_nice=10).driver_nice == 10
