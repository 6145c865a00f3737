"""POST /ingest/events over HTTP: per-event status, 422s and 403s (in-process, fakes)."""

from __future__ import annotations

import pytest

from batch_ingest.source_store import SourceStore
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint
from tests.unit.batch_ingest.events.test_events import delete, envelope, upsert

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
TEAM = "dao_events"


def token(teams) -> str:
    return mint(claims(teams=teams))


@pytest.fixture
def gateway(tmp_path):
    gw = build_gateway(policy=TENANCY_POLICY)
    gw.services.pipeline.sources = SourceStore(f"sqlite:///{tmp_path}/state.db")
    return gw


def post(gw, events, teams=None, **body):
    return gw.client.post(
        "/ingest/events",
        json={"events": events, **body},
        headers={"authorization": f"Bearer {token(teams or {TEAM: ['owner']})}"},
    )


def test_events_are_applied_with_a_status_and_revision_each(gateway):
    r = post(gateway, [upsert("d1", "Milvus notes", revision=2), upsert("d1", "old", revision=1)])
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(e["status"], e["revision"]) for e in body["events"]] == [
        ("indexed", 2),
        ("skipped_stale", 1),
    ]
    assert body["counts"]["indexed"] == 1 and body["counts"]["skipped_stale"] == 1
    again = post(gateway, [upsert("d1", "Milvus notes", revision=2)]).json()
    assert again["events"][0]["status"] == "unchanged"
    gone = post(gateway, [delete("d1", 3)]).json()
    assert gone["events"][0]["status"] == "deleted"
    assert not [c for c in gateway.store.rows.values() if c.doc_id == "d1"]


def test_an_invalid_envelope_is_422_naming_it_and_nothing_is_applied(gateway):
    r = post(gateway, [upsert("d1", "fine", revision=1), envelope(version="2.0")])
    assert r.status_code == 422
    fields = [f["field"] for f in r.json()["fields"]]
    assert fields == ["events.1.version"]
    assert not gateway.store.rows


def test_partial_reports_invalid_envelopes_and_applies_the_rest(gateway):
    r = post(gateway, [upsert("d1", "fine", revision=1), {"event_id": "x"}], partial=True)
    assert r.status_code == 200, r.text
    assert [e["status"] for e in r.json()["events"]] == ["indexed", "invalid"]


@pytest.mark.parametrize("body", [{"events": []}, {"events": "x"}, {"events": [{}], "x": 1}])
def test_bad_request_shape_is_422(gateway, body):
    r = gateway.client.post(
        "/ingest/events",
        json=body,
        headers={"authorization": f"Bearer {token({TEAM: ['owner']})}"},
    )
    assert r.status_code == 422


def test_member_may_not_write_events_and_nothing_is_applied(gateway):
    r = post(gateway, [upsert("d1", "x", revision=1)], teams={TEAM: ["member"]})
    assert r.status_code == 403 and r.json()["reason"] == "write_not_granted"
    assert not gateway.store.rows


def test_event_for_a_team_not_granted_is_403_naming_the_event(gateway):
    other = envelope(payload={"doc_id": "d2", "text": "x"}, meta={"team_id": "dao_other"})
    r = post(gateway, [upsert("d1", "x", revision=1), other])
    assert r.status_code == 403
    assert r.json()["fields"][0]["field"] == "events.1.meta.team_id"
    assert not gateway.store.rows


def test_confidential_file_needs_a_role_that_may_write_it(gateway):
    conf = envelope(
        "file.uploaded", {"file_id": "f1", "text": "secret", "visibility": "confidential"}
    )
    r = post(gateway, [conf], teams={TEAM: ["service"]})
    assert r.status_code == 403


def test_delete_is_checked_against_the_stored_document(gateway):
    conf = envelope(payload={"doc_id": "c1", "text": "secret", "visibility": "confidential"})
    assert post(gateway, [conf]).status_code == 200
    r = post(gateway, [delete("c1", 2_000_000_000_000)], teams={TEAM: ["service"]})
    assert r.status_code == 403 and r.json()["reason"] == "confidential_not_granted"


def test_too_many_events_is_422(gateway):
    gateway.services.settings.ingest.max_documents = 2
    r = post(gateway, [upsert(f"d{i}", "x", revision=1) for i in range(3)])
    assert r.status_code == 422
