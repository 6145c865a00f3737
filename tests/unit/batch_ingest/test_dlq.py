"""python -m batch_ingest.dlq: which dead letters a filter picks."""

from __future__ import annotations

from datetime import UTC, datetime

from batch_ingest.dlq import DeadLetter, Filter
from batch_ingest.event_types import event_subject


def letter(seq, team="dao_a", etype="doc.upserted", status="failed", error="milvus down", at=0):
    subject = event_subject(team, etype, "it1.")
    body = {"subject": subject, "type": etype, "status": status, "error": error, "failed_at": at}
    return DeadLetter(seq, body | {"event_id": f"e{seq}", "event": "{}"})


def test_the_team_is_read_from_the_subject_after_a_prefix():
    assert letter(1, team="team a.b").team == "team a.b"
    assert DeadLetter(2, {"subject": "doc.upserted"}).team is None


def test_a_filter_picks_by_team_type_status_reason_and_time():
    t0 = datetime(2026, 12, 4, 10, tzinfo=UTC).timestamp()
    letters = [
        letter(1, at=t0),
        letter(2, team="dao_b", at=t0),
        letter(3, etype="doc.deleted", at=t0 + 60),
        letter(4, status="invalid", error="bad field", at=t0 + 120),
    ]
    pick = lambda f: [x.seq for x in letters if f(x)]  # noqa: E731
    assert pick(Filter()) == [1, 2, 3]  # failed ones by default
    assert pick(Filter(team="dao_a")) == [1, 3]
    assert pick(Filter(type="doc.deleted")) == [3]
    assert pick(Filter(status="any", reason="BAD")) == [4]
    since = datetime.fromtimestamp(t0 + 30, UTC)
    assert pick(Filter(since=since, status="any")) == [3, 4]
    assert pick(Filter(until=since)) == [1, 2]
    assert "dao_a" in letters[0].line() and "milvus down" in letters[0].line()
