"""Bus events: envelope validation, mapping to documents, ordering and delete (fakes)."""

from __future__ import annotations

import json

import pytest

from batch_ingest.chunking import Chunker, whitespace_tokens
from batch_ingest.events import InvalidEvent, MappedEvent, apply_events, parse_event
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.source_store import SourceStore
from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeVectorStore

TEAM = "dao_events"


def envelope(etype="doc.upserted", payload=None, *, event_id="e1", ts=1_764_583_200, **kw):
    domain = etype.split(".")[0]
    body = {
        "event_id": event_id,
        "ts": ts,
        "domain": domain,
        "type": etype,
        "version": "1.0",
        "actor": {"id": "u_alice", "kind": "user"},
        "payload": payload if payload is not None else {"doc_id": "d1", "text": "Milvus notes"},
        "meta": {"team_id": TEAM, "trace_id": "tr-1"},
    }
    body.update(kw)
    return body


def upsert(doc_id, text, revision=None, event_id=None, ts=1_764_583_200):
    payload = {"doc_id": doc_id, "text": text}
    if revision is not None:
        payload["revision"] = revision
    return envelope(payload=payload, event_id=event_id or f"{doc_id}-{revision}", ts=ts)


def delete(doc_id, revision, doc_type="doc"):
    return envelope(
        "doc.deleted",
        {"doc_id": doc_id, "doc_type": doc_type, "revision": revision},
        event_id=f"del-{doc_id}-{revision}",
    )


# --- mapping ----------------------------------------------------------------------------------


def test_chat_message_maps_to_a_message_document_authored_by_the_actor():
    ev = parse_event(
        envelope(
            "chat.message.created",
            {"message_id": "m1", "text": "hello", "channel_id": "ch_general", "extra": 1},
        )
    )
    assert isinstance(ev, MappedEvent)
    doc = ev.document
    assert (doc.team_id, doc.doc_type, doc.doc_id) == (TEAM, "message", "m1")
    assert doc.author_id == "u_alice" and doc.channel_id == "ch_general"
    assert doc.created_at == 1_764_583_200  # the event's time when the payload has none
    assert ev.revision == 1_764_583_200_000  # ts in epoch ms


def test_agent_actor_becomes_the_agent_id_of_a_message():
    raw = envelope("chat.message.created", {"message_id": "m1", "text": "hi"})
    raw["actor"] = {"id": "ag_bot", "kind": "agent"}
    doc = parse_event(raw).document
    assert doc.agent_id == "ag_bot" and doc.author_id == ""


def test_short_type_is_completed_with_the_domain():
    ev = parse_event(
        envelope("chat.message.created", {"message_id": "m", "text": "x"}, type="message.created")
    )
    assert ev.envelope.type == "chat.message.created"


@pytest.mark.parametrize(
    ("domain", "etype", "full"),
    [("doc", "doc.upsert", "doc.upserted"), ("chat", "message.created", "chat.message.created")],
)
def test_the_specifications_spellings_are_aliases(domain, etype, full):
    payload = {"doc_id": "d1", "message_id": "m1", "text": "Milvus notes"}
    ev = parse_event(envelope(full, payload, domain=domain, type=etype))
    assert isinstance(ev, MappedEvent), ev
    assert ev.envelope.type == full


def test_the_bus_reads_the_alias_subjects_as_their_types():
    from batch_ingest.event_types import parse_subject
    from batch_ingest.settings import ConsumerSettings

    cfg = ConsumerSettings(subject_prefix="t1.")
    assert {
        "t1.rag.team.*.doc.upsert",
        "t1.rag.team.*.message.created",
        "t1.rag.team.*.doc.upserted",
    } <= set(cfg.subjects)
    assert parse_subject("t1.rag.team.a.doc.upsert", "t1.") == ("a", "doc.upserted", "")
    assert parse_subject("t1.rag.team.a.message.created", "t1.") == (
        "a",
        "chat.message.created",
        "",
    )
    assert parse_subject("t1.rag.team.a.doc.deleted", "t1.") == ("a", "doc.deleted", "")


def test_only_team_subjects_unless_a_migration_reads_the_old_ones_too():
    from batch_ingest.settings import ConsumerSettings

    assert all(s.startswith("rag.team.*.") for s in ConsumerSettings().subjects)
    legacy = ConsumerSettings(legacy_subjects=True).subjects
    assert "doc.upserted" in legacy and "rag.team.*.doc.upserted" in legacy


@pytest.mark.parametrize(
    "team", ["dao_greenfood", "Team-7", "team a.b", "x*y>z", "ünïcode", "=x", "a" * 200]
)
def test_every_team_id_has_one_subject_token_and_back(team):
    from batch_ingest.event_types import event_subject, parse_subject, team_token, token_team

    token = team_token(team)
    assert not set(token) & set(".*> \t") and token
    assert token_team(token) == team
    assert parse_subject(event_subject(team, "doc.upserted", "p."), "p.") == (
        team,
        "doc.upserted",
        "",
    )
    named = event_subject(team, "chat.message.created", "p.", producer="wiki-sync")
    assert parse_subject(named, "p.") == (team, "chat.message.created", "wiki-sync")


def test_a_non_canonical_team_token_names_no_team():
    from batch_ingest.event_types import token_team

    assert token_team("=YQ") is None  # "a" is written plain: one team, one subject
    assert token_team("=!!") is None and token_team("=") is None and token_team("a.b") is None


def test_file_uploaded_maps_to_a_file_titled_by_filename():
    ev = parse_event(
        envelope(
            "file.uploaded",
            {
                "file_id": "f1",
                "text": "lab report",
                "filename": "lab.pdf",
                "visibility": "confidential",
            },
        )
    )
    doc = ev.document
    assert (doc.doc_type, doc.doc_id, doc.title, doc.visibility) == (
        "file",
        "f1",
        "lab.pdf",
        "confidential",
    )


def test_doc_upserted_keeps_its_doc_type_and_delete_names_the_key():
    ev = parse_event(envelope(payload={"doc_id": "w1", "doc_type": "wiki", "text": "[[Other]]"}))
    assert ev.key == (TEAM, "wiki", "w1")
    gone = parse_event(delete("w1", 3, doc_type="wiki"))
    assert gone.action == "delete" and gone.key == (TEAM, "wiki", "w1") and gone.revision == 3


def test_payload_revision_wins_over_ts_and_iso_ts_is_parsed():
    assert parse_event(upsert("d", "t", revision=7)).revision == 7
    ev = parse_event(envelope(ts="2025-12-01T10:00:00Z"))
    assert ev.revision == 1_764_583_200_000
    assert parse_event(envelope(ts=1_764_583_200_123)).revision == 1_764_583_200_123


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": "2.0"}, "version"),
        ({"version": "one"}, "version"),
        ({"type": "chat.message.deleted"}, "type"),
        ({"type": "doc.upserted", "domain": "chat"}, "type"),
        ({"ts": "yesterday"}, "ts"),
        ({"meta": {"trace_id": "x"}}, "meta.team_id"),
        ({"actor": {"id": "u"}}, "actor.kind"),
        ({"payload": {"doc_id": "d"}}, "payload.text"),
        ({"payload": {"doc_id": "d", "text": "  "}}, "payload.text"),
        ({"payload": {"doc_id": "d", "text": "x", "doc_type": "Bad Type"}}, "payload.doc_type"),
        ({"payload": {"doc_id": "d", "text": "x", "team_id": "dao_other"}}, "payload.team_id"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_envelopes_name_the_field(change, field):
    ev = parse_event(
        envelope(**change) if "payload" not in change else envelope(payload=change["payload"])
    )
    assert isinstance(ev, InvalidEvent), ev
    assert field in [f["field"] for f in ev.fields], ev.fields


def test_unsupported_major_version_says_which_is_supported():
    ev = parse_event(envelope(version=2))
    assert "major version 1" in ev.message


def test_non_json_and_non_object_are_invalid():
    assert isinstance(parse_event(b"{nope"), InvalidEvent)
    assert isinstance(parse_event([1, 2]), InvalidEvent)


OTHER_TEAM = "dao_other"


@pytest.mark.parametrize(
    "etype, extra, field",
    [
        ("doc.upserted", {"dao_id": OTHER_TEAM}, "payload.dao_id"),
        ("doc.upserted", {"microdao_id": OTHER_TEAM}, "payload.microdao_id"),
        # The first alias agreeing does not hide the second one disagreeing.
        ("doc.upserted", {"team_id": TEAM, "dao_id": OTHER_TEAM}, "payload.dao_id"),
        ("doc.upserted", {"document": {"team_id": OTHER_TEAM}}, "payload.document.team_id"),
        (
            "doc.upserted",
            {"documents": [{"team_id": TEAM}, {"team_id": OTHER_TEAM}]},
            "payload.documents.1.team_id",
        ),
        ("chat.message.created", {"microdao_id": OTHER_TEAM}, "payload.microdao_id"),
        ("file.uploaded", {"document": {"dao_id": OTHER_TEAM}}, "payload.document.dao_id"),
        ("doc.deleted", {"microdao_id": OTHER_TEAM}, "payload.microdao_id"),
        ("doc.upserted", {"team_id": 7}, "payload.team_id"),
    ],
)
def test_a_payload_naming_another_team_anywhere_is_invalid(etype, extra, field):
    payload = {"doc_id": "d1", "message_id": "m1", "file_id": "f1", "doc_type": "doc"}
    ev = parse_event(envelope(etype, {**payload, "text": "Milvus notes", **extra}))
    assert isinstance(ev, InvalidEvent), ev
    assert [f["field"] for f in ev.fields] == [field]
    assert "meta.team_id" in ev.message


def test_the_payload_may_repeat_its_own_team_anywhere():
    payload = {
        "doc_id": "d1",
        "text": "Milvus notes",
        "team_id": f" {TEAM} ",
        "microdao_id": TEAM,
        "dao_id": None,
        "document": {"team_id": TEAM},
    }
    ev = parse_event(envelope(payload=payload))
    assert isinstance(ev, MappedEvent), ev
    assert ev.key == (TEAM, "doc", "d1")


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"doc_id": "d1", "text": "bad \ud800 text"}, "payload.text"),
        ({"doc_id": "d1", "text": "x", "title": "\udfff"}, "payload.title"),
        ({"doc_id": "d1", "text": "x", "score": float("nan")}, "payload.score"),
        ({"doc_id": "d1", "text": "x", "extra": {"deep": [float("inf")]}}, "payload.extra.deep.0"),
    ],
)
def test_invalid_unicode_and_non_finite_numbers_are_invalid(payload, field):
    ev = parse_event(envelope(payload=payload))
    assert isinstance(ev, InvalidEvent), ev
    assert [f["field"] for f in ev.fields] == [field]


@pytest.mark.parametrize(
    "ts", [float("inf"), float("nan"), 10**400], ids=["inf", "nan", "beyond_year_9999"]
)
def test_a_non_finite_or_huge_ts_is_invalid_not_an_exception(ts):
    ev = parse_event(json.dumps(envelope(ts=ts)))
    assert isinstance(ev, InvalidEvent), ev
    assert [f["field"] for f in ev.fields] == ["ts"]


def test_a_lone_surrogate_in_the_ids_is_reported_printably():
    raw = envelope(event_id="e\ud800", meta={"team_id": TEAM, "trace_id": "t\udc00"})
    ev = parse_event(json.dumps(raw))
    assert isinstance(ev, InvalidEvent)
    assert {f["field"] for f in ev.fields} == {"event_id", "meta.trace_id"}
    # Whatever the results carry can be written as UTF-8 (the HTTP answer, the DLQ body).
    (ev.event_id + ev.trace_id + ev.message).encode()


# --- applying: ordering, idempotency, delete -----------------------------------------------------


def fake_pipeline(tmp_path) -> IngestPipeline:
    """A pipeline over fakes, its source registry in ``tmp_path`` (the bus tests' too)."""
    return IngestPipeline(
        embedder=FakeEmbedder(dim=16),
        store=FakeVectorStore(),
        graph=FakeGraphStore(),
        chunker=Chunker(whitespace_tokens, 20, 4),
        embed_model="fake@v1",
        sources=SourceStore(f"sqlite:///{tmp_path}/state.db"),
    )


@pytest.fixture
def pipeline(tmp_path):
    return fake_pipeline(tmp_path)


async def run(pipeline, *raws):
    results, _ = await apply_events(pipeline, [parse_event(r) for r in raws])
    return [r.status for r in results]


def texts(pipeline, doc_id="d1"):
    return sorted(c.text for c in pipeline.store.rows.values() if c.doc_id == doc_id)


async def test_the_same_event_twice_changes_nothing(pipeline):
    raw = upsert("d1", "solar panels and batteries", revision=1)
    assert await run(pipeline, raw) == ["indexed"]
    rows = dict(pipeline.store.rows)
    calls = len(pipeline.embedder.calls)
    assert await run(pipeline, raw, raw) == ["unchanged", "unchanged"]
    assert pipeline.store.rows == rows and len(pipeline.embedder.calls) == calls


async def test_an_older_revision_after_a_newer_one_is_skipped(pipeline):
    assert await run(pipeline, upsert("d1", "version two", revision=2)) == ["indexed"]
    assert await run(pipeline, upsert("d1", "version one", revision=1)) == ["skipped_stale"]
    assert texts(pipeline) == ["version two"]
    assert pipeline.sources.get((TEAM, "doc", "d1")).version == 2


async def test_out_of_order_in_one_batch_the_newest_wins(pipeline):
    statuses = await run(
        pipeline,
        upsert("d1", "version three", revision=3),
        upsert("d1", "version one", revision=1),
        upsert("d1", "version two", revision=2),
    )
    assert statuses == ["indexed", "skipped_stale", "skipped_stale"]
    assert texts(pipeline) == ["version three"]


async def test_ts_orders_documents_without_a_revision(pipeline):
    assert await run(pipeline, upsert("d1", "later", ts=2_000_000_000)) == ["indexed"]
    assert await run(pipeline, upsert("d1", "earlier", ts=1_900_000_000)) == ["skipped_stale"]
    assert texts(pipeline) == ["later"]


async def test_delete_removes_chunks_and_graph_doc_and_tombstones(pipeline):
    long_text = " ".join(f"word{i}" for i in range(60))
    await run(pipeline, upsert("d1", long_text, revision=1), upsert("d2", "keep me", revision=1))
    assert len(texts(pipeline)) > 1 and (TEAM, "d1") in pipeline.graph.docs
    results, _ = await apply_events(pipeline, [parse_event(delete("d1", 2))])
    assert results[0].status == "deleted" and results[0].removed_chunks > 1 and results[0].graph
    assert texts(pipeline) == [] and (TEAM, "d1") not in pipeline.graph.docs
    assert texts(pipeline, "d2") == ["keep me"] and (TEAM, "d2") in pipeline.graph.docs
    row = pipeline.sources.get((TEAM, "doc", "d1"))
    assert row.deleted and row.version == 2
    # A late older upsert does not resurrect it; the same delete again changes nothing.
    assert await run(pipeline, upsert("d1", "zombie", revision=1)) == ["skipped_stale"]
    assert await run(pipeline, delete("d1", 2)) == ["unchanged"]
    assert texts(pipeline) == []
    # A newer upsert brings it back.
    assert await run(pipeline, upsert("d1", "reborn", revision=3)) == ["indexed"]
    assert texts(pipeline) == ["reborn"] and not pipeline.sources.get((TEAM, "doc", "d1")).deleted


async def test_delete_of_an_unknown_document_is_tombstoned(pipeline):
    assert await run(pipeline, delete("ghost", 5)) == ["deleted"]
    assert await run(pipeline, upsert("ghost", "late", revision=4)) == ["skipped_stale"]


async def test_graph_down_fails_the_delete_without_tombstone_so_it_is_retried(pipeline):
    await run(pipeline, upsert("d1", "text", revision=1))
    pipeline.graph.down = True
    assert await run(pipeline, delete("d1", 2)) == ["failed"]
    assert not pipeline.sources.get((TEAM, "doc", "d1")).deleted
    pipeline.graph.down = False
    assert await run(pipeline, delete("d1", 2)) == ["deleted"]


def _broken_registry(*args, **kwargs):
    raise OverflowError("Python int too large to convert to SQLite INTEGER")


async def test_a_failed_registry_write_fails_the_upsert_and_the_redelivery_records_it(
    pipeline, monkeypatch
):
    """Issue 34: acked as indexed, a document the registry missed would be dropped by a
    reindex, and an older revision could overwrite it."""
    key = (TEAM, "doc", "d1")
    monkeypatch.setattr(pipeline.sources, "put", _broken_registry)
    results, _ = await apply_events(pipeline, [parse_event(upsert("d1", "first", revision=5))])
    r = results[0]
    assert r.status == "failed" and r.searchable  # written, announced once, not acked
    assert "source registry" in r.error and "OverflowError" in r.error
    assert pipeline.sources.get(key) is None
    monkeypatch.undo()
    results, _ = await apply_events(pipeline, [parse_event(upsert("d1", "first", revision=5))])
    assert results[0].status == "unchanged" and not results[0].searchable
    assert pipeline.sources.get(key).version == 5
    assert await run(pipeline, upsert("d1", "older", revision=4)) == ["skipped_stale"]
    assert texts(pipeline) == ["first"]


async def test_a_failed_tombstone_fails_the_delete_and_the_redelivery_records_it(
    pipeline, monkeypatch
):
    key = (TEAM, "doc", "d1")
    assert await run(pipeline, upsert("d1", "text", revision=1)) == ["indexed"]
    monkeypatch.setattr(pipeline.sources, "tombstone", _broken_registry)
    results, _ = await apply_events(pipeline, [parse_event(delete("d1", 2))])
    assert results[0].status == "failed" and "source registry" in results[0].error
    assert texts(pipeline) == [] and not pipeline.sources.get(key).deleted
    monkeypatch.undo()
    assert await run(pipeline, delete("d1", 2)) == ["deleted"]
    assert pipeline.sources.get(key).deleted and pipeline.sources.get(key).version == 2
    assert await run(pipeline, upsert("d1", "zombie", revision=1)) == ["skipped_stale"]


async def test_invalid_events_are_reported_in_place(pipeline):
    results, _ = await apply_events(
        pipeline,
        [
            parse_event(upsert("a", "x", revision=1)),
            parse_event({"event_id": "bad"}),
            parse_event(upsert("b", "y", revision=1)),
        ],
    )
    assert [r.status for r in results] == ["indexed", "invalid", "indexed"]
    assert results[1].event_id == "bad" and results[1].fields


async def test_an_event_naming_another_team_in_a_document_is_invalid_and_not_indexed(pipeline):
    # The path POST /ingest/events and the bus consumer share: parse_event, apply_events.
    raw = envelope(payload={"doc_id": "d1", "text": "foreign", "document": {"team_id": OTHER_TEAM}})
    results, _ = await apply_events(pipeline, [parse_event(raw)])
    assert [r.status for r in results] == ["invalid"]
    assert results[0].fields == [
        {
            "field": "payload.document.team_id",
            "problem": f"{OTHER_TEAM!r} differs from meta.team_id {TEAM!r}: an event writes "
            "only into its own team",
        }
    ]
    assert not pipeline.store.rows
    assert pipeline.sources.get((TEAM, "doc", "d1")) is None


async def test_one_embedding_call_for_a_batch(pipeline):
    await run(pipeline, *[upsert(f"d{i}", f"text {i}", revision=1) for i in range(5)])
    assert len(pipeline.embedder.calls) == 1


async def test_graph_down_fails_the_upsert_and_the_redelivery_retries_the_graph(pipeline):
    key = (TEAM, "doc", "d1")
    await run(pipeline, upsert("d1", "first", revision=1))
    pipeline.graph.down = True
    results, _ = await apply_events(pipeline, [parse_event(upsert("d1", "second", revision=2))])
    r = results[0]
    assert r.status == "failed" and r.searchable and not r.graph and "graph" in r.error
    assert texts(pipeline) == ["second"]  # searchable already
    row = pipeline.sources.get(key)
    assert row.version == 1 and row.document.text == "second"  # old revision kept
    # Still down at the redelivery: failed again, but not announced as searchable again.
    results, _ = await apply_events(pipeline, [parse_event(upsert("d1", "second", revision=2))])
    assert results[0].status == "failed" and not results[0].searchable
    pipeline.graph.down = False
    calls = len(pipeline.embedder.calls)
    results, _ = await apply_events(pipeline, [parse_event(upsert("d1", "second", revision=2))])
    assert results[0].status == "unchanged" and results[0].graph and not results[0].searchable
    assert len(pipeline.embedder.calls) == calls  # not embedded again
    assert pipeline.sources.get(key).version == 2
    assert await run(pipeline, upsert("d1", "second", revision=2)) == ["unchanged"]


async def test_a_document_leased_by_another_writer_is_reported_busy(pipeline):
    key = (TEAM, "doc", "d1")
    assert pipeline.sources.claim([key], "someone-else", ttl_s=60) == {key}
    results, _ = await apply_events(
        pipeline,
        [parse_event(upsert("d1", "blocked", revision=1)), parse_event(upsert("d2", "free", 1))],
        lease_wait_s=0.2,
    )
    assert [r.status for r in results] == ["failed", "indexed"]
    assert results[0].error.startswith("busy") and texts(pipeline) == []
    pipeline.sources.release([key], "someone-else")
    assert await run(pipeline, upsert("d1", "blocked", revision=1)) == ["indexed"]
    # Leases are given back after each batch.
    assert pipeline.sources.claim([key, (TEAM, "doc", "d2")], "next", ttl_s=60) == {
        key,
        (TEAM, "doc", "d2"),
    }


async def test_two_writers_of_one_document_apply_its_revisions_in_turn(tmp_path):
    """Two pipelines (as two consumer replicas) share a registry; the older revision's writer
    is slow to embed. Without the lease both pass the revision check and the older one's
    chunks land last; with it the newest revision wins whatever the timing."""
    import asyncio

    sources = SourceStore(f"sqlite:///{tmp_path}/state.db")
    store, graph = FakeVectorStore(), FakeGraphStore()

    class SlowEmbedder(FakeEmbedder):
        async def embed(self, texts, kind):
            await asyncio.sleep(0.3)
            return await super().embed(texts, kind)

    def writer(embedder):
        return IngestPipeline(
            embedder=embedder,
            store=store,
            graph=graph,
            chunker=Chunker(whitespace_tokens, 20, 4),
            embed_model="fake@v1",
            sources=sources,
        )

    slow, fast = writer(SlowEmbedder(dim=16)), writer(FakeEmbedder(dim=16))

    async def late_newer():
        await asyncio.sleep(0.05)  # the slow writer holds the lease by now
        return await apply_events(fast, [parse_event(upsert("d1", "revision two", revision=2))])

    (old, _), (new, _) = await asyncio.gather(
        apply_events(slow, [parse_event(upsert("d1", "revision one", revision=1))]),
        late_newer(),
    )
    assert old[0].status == "indexed" and new[0].status == "indexed"
    assert sorted(c.text for c in store.rows.values()) == ["revision two"]
    assert sources.get((TEAM, "doc", "d1")).version == 2
    sources.close()


async def test_a_lease_is_renewed_while_its_batch_runs_and_lapses_after(pipeline):
    """A batch longer than the lease's time to live keeps its documents: the lease is renewed
    every third of it. Once given back (or, for a dead writer, expired) another takes it."""
    import asyncio

    key = (TEAM, "doc", "d1")
    slow = pipeline.embedder.embed

    async def slow_embed(texts, kind):
        await asyncio.sleep(1.0)  # several times the lease's 0.3 s
        return await slow(texts, kind)

    pipeline.embedder.embed = slow_embed

    async def intruder() -> set:
        await asyncio.sleep(0.7)  # the first lease alone would have expired by now
        return pipeline.sources.claim([key], "intruder", ttl_s=60)

    (results, _), taken = await asyncio.gather(
        apply_events(pipeline, [parse_event(upsert("d1", "long", 1))], lease_ttl_s=0.3),
        intruder(),
    )
    assert results[0].status == "indexed"
    assert taken == set()  # still held by the running batch
    assert pipeline.sources.claim([key], "intruder", ttl_s=0.1) == {key}  # given back
    await asyncio.sleep(0.15)
    assert pipeline.sources.claim([key], "next", ttl_s=60) == {key}  # expired, taken over


def test_an_events_acl_reaches_the_document():
    payload = {
        "doc_id": "hr1",
        "text": "salary bands",
        "acl": {"allowed_groups": ["hr"], "denied_groups": ["temps"]},
    }
    ev = parse_event(envelope(payload=payload))
    assert isinstance(ev, MappedEvent)
    assert ev.document.acl_allow == ("group:hr",)
    assert ev.document.acl_deny == ("group:temps",)


def test_an_event_with_a_bad_acl_is_invalid_naming_the_field():
    ev = parse_event(envelope(payload={"doc_id": "d", "text": "t", "acl": {"groups": ["hr"]}}))
    assert isinstance(ev, InvalidEvent)
    assert "payload.acl" in json.dumps(ev.__dict__, default=str)
