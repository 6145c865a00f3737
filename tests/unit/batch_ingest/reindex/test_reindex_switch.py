"""The reindex switch (issue 33): vectors copied when the model is unchanged, and every write
acknowledged before the switch in the new version at the switch — with fakes for Milvus."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from batch_ingest.documents import DocumentAcl
from batch_ingest.write_barrier import WriteBarrier
from tests.unit.batch_ingest.reindex import test_reindex as base
from tests.unit.batch_ingest.reindex.test_reindex import MODEL, TEAM, doc, expected_chunks, options

env = base.env  # the fixture: settings, a registry, fake versions and a counting embedder


def stored_v1(env, docs, model: str = MODEL) -> None:
    """The team's live v1 as ingestion left it: distinct vectors, tag ``model``."""
    env.versions.create(TEAM, 1)
    rng = np.random.default_rng(0)
    rows = [
        replace(c, embed_model=model, vector=[float(x) for x in rng.random(4)])
        for d in docs
        for c in env.builder.build_chunks(d)
    ]
    env.versions.upsert(env.versions.name(TEAM, 1), rows)
    env.versions.switch(TEAM, 1)
    env.sources.put(docs)


def before_the_pause(env, hook) -> None:
    """Run ``hook`` once, when the job verifies its target (its first flush): after the
    bulk pass and the first catch-up, right before the last catch-up and the switch."""
    original = env.versions.flush
    fired: list[bool] = []

    def flush(physical: str) -> None:
        if not fired:
            fired.append(True)
            hook()
        original(physical)

    env.versions.flush = flush


def write(env, document) -> None:
    """What the ingestion pipeline does for an acknowledged write (fake store)."""
    live = env.versions.live
    chunks = env.builder.build_chunks(document)
    old = env.versions.collections[live]
    env.versions.upsert(
        live,
        [
            replace(c, vector=old[c.chunk_id].vector if c.chunk_id in old else [0.5] * 4)
            for c in chunks
        ],
    )
    env.sources.put([document])


def delete(env, document) -> None:
    live = env.versions.live
    for c in env.builder.build_chunks(document):
        env.versions.collections[live].pop(c.chunk_id, None)
    env.sources.tombstone((TEAM, "doc", document.doc_id))


def test_an_unchanged_model_copies_vectors_and_never_embeds(env):
    docs = [doc(i) for i in range(6)]
    stored_v1(env, docs)
    v1 = dict(env.versions.collections[env.versions.name(TEAM, 1)])
    result = env.make().run(options(keep_previous=True))
    assert result.job.status == "succeeded" and env.versions.current(TEAM) == 2
    assert env.embed.texts == 0
    live = env.versions.live_rows()
    assert len(live) == result.job.rows_in_target == expected_chunks(env, docs)
    assert all(list(live[i].vector) == list(v1[i].vector) for i in live)


def test_a_model_change_embeds_every_chunk(env):
    docs = [doc(i) for i in range(4)]
    stored_v1(env, docs, model="old@v0")
    env.make().run(options())
    assert env.embed.texts == expected_chunks(env, docs)
    assert {c.embed_model for c in env.versions.live_rows().values()} == {MODEL}


def test_writes_acknowledged_before_the_switch_are_in_the_new_version_at_it(env):
    docs = [doc(i) for i in range(6)]
    stored_v1(env, docs)
    tightened = doc(1, acl=DocumentAcl(allowed_groups=["hr"]))
    seen: dict[str, object] = {}

    def last_writes() -> None:
        # The last writes before the pause: the bulk pass and first catch-up are over.
        write(env, tightened)
        delete(env, docs[2])

    original_switch = env.versions.switch

    def switch(team: str, version: int) -> str:
        target = env.versions.collections[env.versions.name(team, version)]
        seen["acl"] = {c.acl_allow for c in target.values() if c.doc_id == "d001"}
        seen["deleted"] = [c for c in target.values() if c.doc_id == "d002"]
        return original_switch(team, version)

    before_the_pause(env, last_writes)
    env.versions.switch = switch
    result = env.make().run(options())
    assert seen == {"acl": {tightened.acl_allow}, "deleted": []}
    assert env.embed.texts == 0  # an access-list change and a delete need no model
    live = env.versions.live_rows()
    assert (
        len(live)
        == result.job.expected_chunks
        == expected_chunks(env, docs) - len(env.builder.build_chunks(docs[2]))
    )


def test_an_unchanged_model_catches_up_in_process_too(env, monkeypatch):
    """With the Ray engine and the same model, neither the bulk pass nor the first catch-up
    starts an actor pool: on the shipped setup a pool waited 300 s for CPUs the Serve
    replicas hold, and the job failed, for one access-list change made during the bulk pass."""
    import batch_ingest.reindex.writer as writer

    def no_pool(*args, **kwargs):
        raise AssertionError("an actor pool was started")

    monkeypatch.setattr(writer, "run_ray", no_pool)
    docs = [doc(i) for i in range(6)]
    stored_v1(env, docs)
    tightened = doc(1, acl=DocumentAcl(allowed_groups=["hr"]))
    original_upsert, fired = env.versions.upsert, []

    def upsert(physical, rows):
        # The first rows the bulk pass writes: a write lands while it runs.
        if not fired and physical != env.versions.live:
            fired.append(True)
            write(env, tightened)
        return original_upsert(physical, rows)

    env.versions.upsert = upsert
    result = env.make().run(replace(options(), engine="ray"))
    assert fired and result.job.status == "succeeded"
    assert {c.acl_allow for c in env.versions.live_rows().values() if c.doc_id == "d001"} == {
        tightened.acl_allow
    }
    assert env.embed.texts == 0


def test_a_write_during_the_switch_waits_and_lands_after_it(env):
    stored_v1(env, [doc(i) for i in range(3)])
    barrier = WriteBarrier(env.sources.engine, wait_s=10)
    timeline: list[str] = []
    original_switch = env.versions.switch
    writer: list[threading.Thread] = []

    def switch(team: str, version: int) -> str:
        def write_now() -> None:
            release = barrier.acquire_shared([TEAM])
            timeline.append(f"write sees v{env.versions.current(TEAM)}")
            release()

        writer.append(threading.Thread(target=write_now))
        writer[0].start()
        writer[0].join(0.3)
        timeline.append("switch")
        return original_switch(team, version)

    env.versions.switch = switch
    env.make().run(options())
    writer[0].join(5)
    assert timeline == ["switch", "write sees v2"]


def test_a_changed_text_under_a_model_change_is_embedded_after_the_switch(env):
    docs = [doc(i) for i in range(4)]
    stored_v1(env, docs, model="old@v0")
    changed = doc(3, words=40)
    at_switch: dict[str, int] = {}

    def last_write() -> None:
        env.sources.put([changed])  # the gateway wrote it (with the old model) just now

    original_switch = env.versions.switch

    def switch(team: str, version: int) -> str:
        target = env.versions.collections[env.versions.name(team, version)]
        at_switch["d003"] = sum(1 for c in target.values() if c.doc_id == "d003")
        return original_switch(team, version)

    before_the_pause(env, last_write)
    env.versions.switch = switch
    result = env.make().run(options())
    # Absent at the switch (never stale), embedded with the new model right after it.
    assert at_switch == {"d003": 0}
    live = [c for c in env.versions.live_rows().values() if c.doc_id == "d003"]
    assert len(live) == len(env.builder.build_chunks(changed))
    assert {c.embed_model for c in live} == {MODEL}
    assert result.job.expected_chunks == expected_chunks(env, [*docs[:3], changed])


def test_a_pool_that_never_fits_fails_within_its_bound_naming_what_is_missing(monkeypatch):
    from batch_ingest.reindex import engines
    from batch_ingest.reindex.options import ReindexError, ReindexOptions

    shortages = iter(["waiting for CPUs: the actor pool needs 0.5, 0.2 of 2 are free"] * 100)
    monkeypatch.setattr(engines, "_shortage", lambda options: next(shortages))
    notes: list[str | None] = []
    opts = ReindexOptions(team_id=TEAM, resource_wait_s=0.3, log_every_s=0.1)
    started = time.monotonic()
    with pytest.raises(ReindexError, match="gave up waiting for CPUs: the actor pool needs 0.5"):
        engines.wait_for_resources(opts, notes.append)
    assert time.monotonic() - started < 2
    assert notes == ["waiting for CPUs: the actor pool needs 0.5, 0.2 of 2 are free"]


def test_a_pool_waits_until_it_fits_and_keeps_its_note_until_the_first_batch(monkeypatch):
    from batch_ingest.reindex import engines
    from batch_ingest.reindex.options import ReindexOptions

    shortages = iter(["waiting for CPUs: busy", None])
    monkeypatch.setattr(engines, "_shortage", lambda options: next(shortages))
    notes: list[str | None] = []
    engines.wait_for_resources(
        ReindexOptions(team_id=TEAM, resource_wait_s=5, log_every_s=0.1), notes.append
    )
    assert notes == ["waiting for CPUs: busy"]


def test_the_job_announces_its_target_before_the_switch_and_withdraws_it_on_failure(env):
    from tests.faults import InjectedFailure, failing_after

    stored_v1(env, [doc(i) for i in range(4)])
    calls: list[tuple[str, int | None]] = []
    env.versions.announce = lambda team, version: calls.append(("announce", version))
    env.versions.withdraw = lambda team: calls.append(("withdraw", None))
    original_switch = env.versions.switch
    env.versions.switch = lambda team, v: calls.append(("switch", v)) or original_switch(team, v)
    env.make().run(options())
    assert calls == [("announce", 2), ("switch", 2)]
    calls.clear()
    with pytest.raises(InjectedFailure):
        env.make(wrap_sink=failing_after(2)).run(options())
    assert calls == [("withdraw", None)]
