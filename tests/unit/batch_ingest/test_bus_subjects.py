"""The bus binds an event to its subject's team (issue 34): the consumer refuses an event
published on another team's subject or on a subject without a team, as an attacker with the
permission to publish for one team would try."""

from __future__ import annotations

import asyncio

import pytest

from batch_ingest.consumer import ConsumerSettings, EventConsumer
from batch_ingest.event_types import event_subject
from tests.unit.batch_ingest.events.test_events import fake_pipeline, upsert
from tests.unit.test_tracing import FakeMsg, FakeNc

TEAM = "dao_events"  # the team of tests.unit.batch_ingest.events.test_events' envelopes


def make_consumer(tmp_path, **cfg) -> EventConsumer:
    pipeline = fake_pipeline(tmp_path)
    return EventConsumer(FakeNc(), pipeline, ConsumerSettings(batch=8, **cfg))  # type: ignore[arg-type]


def stored_docs(consumer: EventConsumer) -> set[str]:
    return {c.doc_id for c in consumer.pipeline.store.rows.values()}  # type: ignore[attr-defined]


def test_an_event_on_its_own_teams_subject_is_applied(tmp_path):
    consumer = make_consumer(tmp_path)
    msg = FakeMsg(upsert("d1", "solar notes", revision=1), event_subject(TEAM, "doc.upserted"))
    (result,) = asyncio.run(consumer.handle([msg]))
    assert result.status == "indexed" and msg.settled == ["ack"]
    ((subject, _),) = consumer.nc.published
    assert subject == f"rag.team.{TEAM}.document.indexed"  # only the team's subscribers


@pytest.mark.parametrize("victim", ["team_b", "team b", "dao_events2", "=ZGFvX2V2ZW50cw"])
def test_an_event_naming_another_team_than_its_subjects_is_refused(tmp_path, victim):
    """A producer allowed on ``victim``'s subject cannot write into ``dao_events`` by naming
    it in ``meta.team_id``."""
    consumer = make_consumer(tmp_path)
    msg = FakeMsg(
        upsert("d1", "wire payments to IBAN", revision=1), event_subject(victim, "doc.upserted")
    )
    (result,) = asyncio.run(consumer.handle([msg]))
    assert result.status == "invalid" and msg.settled == ["term"]
    assert result.fields and result.fields[0]["field"] == "meta.team_id"
    assert stored_docs(consumer) == set() and consumer.nc.published == []
    ((dlq, _),) = consumer.nc.js.published
    assert dlq == "rag.dlq.doc.upserted"


def test_a_delete_on_another_teams_subject_removes_nothing(tmp_path):
    consumer = make_consumer(tmp_path)
    own = FakeMsg(upsert("d1", "keep me", revision=1), event_subject(TEAM, "doc.upserted"))
    asyncio.run(consumer.handle([own]))
    raw = upsert("d1", "x", revision=2)
    raw["type"], raw["payload"] = "doc.deleted", {"doc_id": "d1", "revision": 2}
    (result,) = asyncio.run(consumer.handle([FakeMsg(raw, event_subject("team_b", "doc.deleted"))]))
    assert result.status == "invalid"
    assert stored_docs(consumer) == {"d1"}


def test_a_subject_without_a_team_is_refused_unless_a_migration_reads_it(tmp_path):
    consumer = make_consumer(tmp_path)
    msg = FakeMsg(upsert("d1", "notes", revision=1), "doc.upserted")
    (result,) = asyncio.run(consumer.handle([msg]))
    assert result.status == "invalid" and result.fields[0]["field"] == "subject"
    assert f"rag.team.{TEAM}.doc.upserted" in result.error  # says where to publish
    migrating = make_consumer(tmp_path / "m", legacy_subjects=True)
    msg = FakeMsg(upsert("d1", "notes", revision=1), "doc.upserted")
    (result,) = asyncio.run(migrating.handle([msg]))
    assert result.status == "indexed"


def test_a_type_other_than_its_subjects_is_refused(tmp_path):
    consumer = make_consumer(tmp_path)
    msg = FakeMsg(upsert("d1", "notes", revision=1), event_subject(TEAM, "file.uploaded"))
    (result,) = asyncio.run(consumer.handle([msg]))
    assert result.status == "invalid" and result.fields[0]["field"] == "type"


def test_a_second_spelling_of_the_teams_token_is_no_team(tmp_path):
    """``=ZGFvX2V2ZW50cw`` decodes to ``dao_events`` but is not its token: a permission on
    one spelling must not be bypassed by another."""
    consumer = make_consumer(tmp_path)
    msg = FakeMsg(upsert("d1", "notes", revision=1), "rag.team.=ZGFvX2V2ZW50cw.doc.upserted")
    (result,) = asyncio.run(consumer.handle([msg]))
    assert result.status == "invalid" and stored_docs(consumer) == set()
