"""The operator's revision reset (issue 34): a document frozen by a huge revision is freed,
audited before it changes, and nothing changes without its audit record."""

from __future__ import annotations

import asyncio

from batch_ingest import revisions
from batch_ingest.audit_store import AuditStore
from batch_ingest.events import apply_events, parse_event
from batch_ingest.events.envelope import MAX_REVISION
from tests.unit.batch_ingest.events.test_events import TEAM, fake_pipeline, upsert


def statuses(pipeline, *raws) -> list[str]:
    results, _ = asyncio.run(apply_events(pipeline, [parse_event(r) for r in raws]))
    return [r.status for r in results]


def cli(tmp_path, *args: str, audit: str | None = None) -> int:
    return revisions.main(
        [
            *args,
            "--state-url",
            f"sqlite:///{tmp_path}/state.db",
            "--audit-url",
            audit or f"sqlite:///{tmp_path}/audit.db",
        ]
    )


def test_a_frozen_document_is_freed_by_an_audited_reset(tmp_path, capsys):
    pipeline = fake_pipeline(tmp_path)
    assert statuses(pipeline, upsert("d1", "wrong clock", revision=MAX_REVISION)) == ["indexed"]
    assert statuses(pipeline, upsert("d1", "fixed text", revision=5)) == ["skipped_stale"]
    assert cli(tmp_path, "show", "--team", TEAM, "--doc-id", "d1") == 0
    assert f"revision {MAX_REVISION}" in capsys.readouterr().out
    reset = ["reset", "--team", TEAM, "--doc-id", "d1", "--operator", "alice"]
    assert cli(tmp_path, *reset, "--reason", "a producer's clock ran wild") == 0
    (row,) = AuditStore(f"sqlite:///{tmp_path}/audit.db").query()
    assert (row["action"], row["subject"], row["auth_method"], row["team_id"]) == (
        "ops.revision_reset",
        "alice",
        "cli",
        TEAM,
    )
    assert row["resource"] == f"team:{TEAM}/doc:d1/revision:{MAX_REVISION}->none"
    assert row["reason"] == "a producer's clock ran wild" and row["decision"] == "allow"
    assert statuses(pipeline, upsert("d1", "fixed text", revision=5)) == ["indexed"]
    assert statuses(pipeline, upsert("d1", "older text", revision=4)) == ["skipped_stale"]


def test_nothing_is_reset_without_its_audit_record(tmp_path):
    pipeline = fake_pipeline(tmp_path)
    statuses(pipeline, upsert("d1", "wrong clock", revision=MAX_REVISION))
    (tmp_path / "gone").write_text("a file where the audit database's folder should be")
    reset = ["reset", "--team", TEAM, "--doc-id", "d1", "--reason", "r"]
    assert cli(tmp_path, *reset, audit=f"sqlite:///{tmp_path}/gone/audit.db") == 1
    assert pipeline.sources.get((TEAM, "doc", "d1")).version == MAX_REVISION


def test_an_unknown_document_a_missing_reason_or_a_bad_revision_change_nothing(tmp_path):
    pipeline = fake_pipeline(tmp_path)
    statuses(pipeline, upsert("d1", "text", revision=7))
    base = ["reset", "--team", TEAM]
    assert cli(tmp_path, *base, "--doc-id", "nope", "--reason", "r") == 2
    assert cli(tmp_path, *base, "--doc-id", "d1") == 2  # no reason
    assert cli(tmp_path, *base, "--doc-id", "d1", "--reason", "r", "--to", "-1") == 2
    assert cli(tmp_path, *base, "--doc-id", "d1", "--reason", "r", "--to", str(2**63)) == 2
    assert pipeline.sources.get((TEAM, "doc", "d1")).version == 7
    assert AuditStore(f"sqlite:///{tmp_path}/audit.db").query() == []
