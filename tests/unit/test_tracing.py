"""Trace ids: W3C traceparent parsing, the HTTP headers and log context of a request (error
answers included), the audit record, and the bus consumer's per-event trace ids (fakes)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from batch_ingest.consumer import ConsumerSettings, EventConsumer
from batch_ingest.event_types import event_subject
from batch_ingest.source_store import SourceStore
from deployments.tracing import (
    JsonFormatter,
    TraceIdFilter,
    configure_logging,
    current_trace_id,
    parse_traceparent,
    single_traceparent,
    trace_context,
    traceparent_for,
)
from serve_app.audit.log import AuditLog
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus
from tests.unit.batch_ingest.events.test_events import envelope, fake_pipeline, upsert
from tests.unit.serve_app.audit.test_audit import QUERY, fast

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


# --- traceparent ------------------------------------------------------------------------------


def test_a_valid_traceparent_is_read_field_by_field():
    tp = parse_traceparent(TRACEPARENT)
    assert tp is not None
    assert (tp.version, tp.trace_id, tp.parent_id, tp.flags) == ("00", TRACE, PARENT, "01")
    assert tp.sampled
    assert not parse_traceparent(f"00-{TRACE}-{PARENT}-00").sampled  # type: ignore[union-attr]
    # Optional whitespace around the value is allowed.
    assert parse_traceparent(f" {TRACEPARENT}\t") == tp


def test_a_later_version_is_read_by_its_first_four_fields():
    tp = parse_traceparent(f"cc-{TRACE}-{PARENT}-01-what-the-future-adds")
    assert tp is not None and (tp.version, tp.trace_id) == ("cc", TRACE)
    assert parse_traceparent(f"01-{TRACE}-{PARENT}-00") is not None


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE.upper()}-{PARENT}-01",  # uppercase hex
        f"00-{TRACE}-{PARENT.upper()}-01",
        f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE}-{PARENT}-01-",
        f"00-{TRACE[:-1]}-{PARENT}-01",  # short trace id
        f"00-{TRACE}0-{PARENT}-01",  # long trace id
        f"00-{TRACE}-{PARENT[:-1]}-01",
        f"00-{TRACE}-{PARENT}-1",  # one-digit flags
        f"00-{TRACE}-{PARENT}-0g",
        f"0-{TRACE}-{PARENT}-01",
        f"00_{TRACE}_{PARENT}_01",
        f"x00-{TRACE}-{PARENT}-01",
        f"00-{TRACE[:-1]}z-{PARENT}-01",
        f"cc-{TRACE}-{PARENT}-01.extra",  # a later version's extra fields start with "-"
    ],
)
def test_an_invalid_traceparent_is_ignored(value):
    assert parse_traceparent(value) is None


def test_two_traceparent_headers_are_invalid():
    assert single_traceparent([TRACEPARENT]) is not None
    assert single_traceparent([TRACEPARENT, TRACEPARENT]) is None
    assert single_traceparent([]) is None


def test_the_answer_keeps_the_trace_id_with_a_new_span_id():
    first, second = traceparent_for(TRACE), traceparent_for(TRACE, sampled=True)
    assert first is not None and second is not None
    a, b = parse_traceparent(first), parse_traceparent(second)
    assert a is not None and b is not None
    assert (a.version, a.trace_id, a.flags) == ("00", TRACE, "00")
    assert (b.trace_id, b.flags) == (TRACE, "01")
    assert a.parent_id != b.parent_id  # a fresh span id each time
    # An id in another format has no traceparent (it would contradict X-Trace-Id).
    assert traceparent_for("job-42") is None and traceparent_for("0" * 32) is None


# --- log records ------------------------------------------------------------------------------


def record(msg: str = "hello", **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord("batch_ingest.x", logging.INFO, __file__, 1, msg, None, None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_the_filter_puts_the_current_trace_id_on_every_record():
    f = TraceIdFilter()
    rec = record()
    assert f.filter(rec) and rec.trace_id == ""  # type: ignore[attr-defined]
    with trace_context("t-42"):
        assert current_trace_id() == "t-42"
        inside = record()
        f.filter(inside)
        explicit = record(trace_id="t-given")
        f.filter(explicit)
    assert current_trace_id() == ""
    assert inside.trace_id == "t-42"  # type: ignore[attr-defined]
    assert explicit.trace_id == "t-given"  # type: ignore[attr-defined]


def test_json_lines_carry_level_logger_message_trace_id_and_extras():
    rec = record("indexed %d", team_id="dao_a")
    rec.args = (3,)
    with trace_context("t-9"):
        TraceIdFilter().filter(rec)
    out = json.loads(JsonFormatter().format(rec))
    assert out["level"] == "INFO" and out["logger"] == "batch_ingest.x"
    assert out["message"] == "indexed 3" and out["trace_id"] == "t-9"
    assert out["team_id"] == "dao_a" and out["ts"].startswith("20")
    assert "args" not in out and "msg" not in out


def test_configure_logging_writes_json_lines_with_the_trace_id(monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    stream = io.StringIO()
    configure_logging("json", stream=stream)
    (handler,) = root.handlers
    try:
        with trace_context("t-cli"):
            logging.getLogger("batch_ingest.consumer").info("consuming")
    finally:
        root.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["message"] == "consuming" and line["trace_id"] == "t-cli"
    with pytest.raises(ValueError, match="log format"):
        configure_logging("yaml")


# --- HTTP -------------------------------------------------------------------------------------


@pytest.fixture
def gateway(tmp_path, clean_gateway_env):
    gw = build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())
    gw.services.recorder.log = AuditLog(fast(f"sqlite:///{tmp_path / 'audit.db'}"))
    app = gw.client.app

    @app.get("/_test/log")
    def log_something() -> dict[str, str]:
        logging.getLogger("serve_app.probe").info("probe inside the request")
        return {"ok": "yes"}

    @app.get("/_test/boom")
    def boom() -> None:
        raise RuntimeError("boom")

    yield gw
    gw.services.recorder.log.close()


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO)
    caplog.handler.addFilter(TraceIdFilter())
    return caplog


def token(teams=None) -> str:
    return mint(claims(teams=teams or {"dao_a": ["member"]}))


def assert_traced(response, trace_id: str) -> None:
    assert response.headers["x-trace-id"] == trace_id
    tp = parse_traceparent(response.headers["traceparent"])
    assert tp is not None and tp.trace_id == trace_id and tp.parent_id != PARENT


def test_a_traceparent_names_the_trace_of_the_response_and_the_audit_record(gateway):
    r = gateway.search(QUERY, token(), traceparent=TRACEPARENT, **{"x-trace-id": "ignored"})
    assert r.status_code == 200, r.text
    assert_traced(r, TRACE)
    assert r.headers["traceparent"].endswith("-01")  # the caller's sampled flag is kept
    assert gateway.services.recorder.log.flush(5)
    (row,) = gateway.services.recorder.log.query()
    assert row["trace_id"] == TRACE


def test_without_a_valid_traceparent_x_trace_id_then_a_new_id_decide(gateway):
    r = gateway.client.get("/healthz", headers={"traceparent": "00-bad", "x-trace-id": "job-42"})
    assert r.headers["x-trace-id"] == "job-42"
    assert "traceparent" not in r.headers  # job-42 is no W3C trace id
    w3c = "a" * 32
    assert_traced(gateway.client.get("/healthz", headers={"x-trace-id": w3c}), w3c)
    fresh = gateway.client.get("/healthz")
    new_id = fresh.headers["x-trace-id"]
    assert len(new_id) == 32 and new_id != TRACE
    assert_traced(fresh, new_id)
    assert fresh.headers["traceparent"].endswith("-00")


def test_log_records_of_the_request_carry_its_trace_id(gateway, logs):
    r = gateway.client.get("/_test/log", headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200
    (rec,) = [r for r in logs.records if r.name == "serve_app.probe"]
    assert rec.trace_id == TRACE  # type: ignore[attr-defined]
    assert current_trace_id() == ""  # reset after the request


@pytest.mark.parametrize(
    ("path", "body", "signed", "status"),
    [
        ("/rag/search_docs", QUERY, False, 401),  # no credential
        ("/rag/search_docs", {"team_id": "dao_a", "query": "x", "top_k": "many"}, True, 422),
        ("/no/such/route", None, False, 404),
    ],
)
def test_error_answers_carry_the_trace_headers_too(gateway, path, body, signed, status):
    headers = {"traceparent": TRACEPARENT}
    if signed:
        headers["authorization"] = f"Bearer {token()}"
    if body is None:
        r = gateway.client.get(path, headers=headers)
    else:
        r = gateway.client.post(path, json=body, headers=headers)
    assert r.status_code == status, r.text
    assert_traced(r, TRACE)
    assert r.json()["trace_id"] == TRACE


def test_an_unexpected_error_is_a_500_with_the_trace_headers_and_a_traced_log(gateway, logs):
    r = gateway.client.get("/_test/boom", headers={"traceparent": TRACEPARENT})
    assert r.status_code == 500 and r.json()["trace_id"] == TRACE
    assert_traced(r, TRACE)
    (rec,) = [r for r in logs.records if r.getMessage().startswith("unhandled error")]
    assert rec.trace_id == TRACE  # type: ignore[attr-defined]


def test_events_over_http_keep_the_request_trace_and_report_each_events_own(gateway, tmp_path):
    gateway.services.pipeline.sources = SourceStore(f"sqlite:///{tmp_path}/state.db")
    events = [upsert("d1", "Milvus notes", revision=1), upsert("d2", "Neo4j notes", revision=1)]
    events[1]["meta"]["trace_id"] = "producer-trace-2"
    r = gateway.client.post(
        "/ingest/events",
        json={"events": events},
        headers={
            "authorization": f"Bearer {token({'dao_events': ['owner']})}",
            "traceparent": TRACEPARENT,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["trace_id"] == TRACE
    assert [e["trace_id"] for e in body["events"]] == ["tr-1", "producer-trace-2"]
    assert gateway.services.recorder.log.flush(5)
    rows = gateway.services.recorder.log.query(action="ingest.events")
    assert len(rows) == 2 and {row["trace_id"] for row in rows} == {TRACE}


# --- the bus consumer -------------------------------------------------------------------------


class FakeMsg:
    def __init__(self, raw: dict[str, Any], subject: str | None = None) -> None:
        self.data = json.dumps(raw).encode()
        team = (raw.get("meta") or {}).get("team_id", "nobody")
        self.subject = subject or event_subject(team, raw["type"])
        self.metadata = SimpleNamespace(num_delivered=1, sequence=SimpleNamespace(stream=1))
        self.settled: list[str] = []

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")

    async def term(self) -> None:
        self.settled.append("term")

    async def in_progress(self) -> None:
        pass


class FakeJs:
    def __init__(self) -> None:
        self.published: list[tuple[str, dict[str, Any]]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, json.loads(payload)))


class FakeNc:
    def __init__(self) -> None:
        self.js = FakeJs()
        self.published: list[tuple[str, dict[str, Any]]] = []

    def jetstream(self) -> FakeJs:
        return self.js

    async def flush(self) -> None:
        pass

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, json.loads(payload)))


@pytest.fixture
def consumer(tmp_path) -> EventConsumer:
    return EventConsumer(FakeNc(), fake_pipeline(tmp_path), ConsumerSettings(batch=8))  # type: ignore[arg-type]


def traced(trace_id: str, doc_id: str) -> dict[str, Any]:
    raw = upsert(doc_id, f"notes about {doc_id}", revision=1, event_id=f"evt-{doc_id}")
    raw["meta"]["trace_id"] = trace_id
    return raw


def consumer_records(logs) -> list[logging.LogRecord]:
    return [r for r in logs.records if r.name.startswith("batch_ingest")]


def test_an_events_trace_id_reaches_its_log_lines_and_its_indexed_notification(consumer, logs):
    msg = FakeMsg(traced("trace-evt-1", "d1"))
    (result,) = asyncio.run(consumer.handle([msg]))
    assert result.status == "indexed" and result.trace_id == "trace-evt-1"
    assert msg.settled == ["ack"]
    records = consumer_records(logs)
    assert records and {r.trace_id for r in records} == {"trace-evt-1"}  # type: ignore[attr-defined]
    assert any(r.getMessage().startswith("event evt-d1 ") for r in records)
    ((subject, note),) = consumer.nc.published
    assert subject == consumer.cfg.notice_subject("dao_events", "indexed")
    assert subject == "rag.team.dao_events.document.indexed"
    assert note["meta"] == {"team_id": "dao_events", "trace_id": "trace-evt-1"}
    assert note["doc_id"] == "d1" and note["event_id"] == "evt-d1"
    assert current_trace_id() == ""


def test_a_batch_logs_each_event_under_its_own_trace_and_the_batch_under_all(consumer, logs):
    untraced = upsert("d3", "notes about d3", revision=1, event_id="evt-d3")
    del untraced["meta"]["trace_id"]
    msgs = [FakeMsg(traced("trace-a", "d1")), FakeMsg(traced("trace-b", "d2")), FakeMsg(untraced)]
    results = asyncio.run(consumer.handle(msgs))
    assert [r.trace_id for r in results] == ["trace-a", "trace-b", ""]
    by_event = {
        r.getMessage().split()[1]: r.trace_id  # type: ignore[attr-defined]
        for r in consumer_records(logs)
        if r.getMessage().startswith("event ")
    }
    assert by_event == {"evt-d1": "trace-a", "evt-d2": "trace-b", "evt-d3": ""}
    (summary,) = [r for r in consumer_records(logs) if r.getMessage().startswith("batch of 3")]
    assert summary.trace_id == "trace-a"  # type: ignore[attr-defined]
    assert "(traces trace-a, trace-b)" in summary.getMessage()
    notes = {n["doc_id"]: n["meta"]["trace_id"] for _, n in consumer.nc.published}
    assert notes == {"d1": "trace-a", "d2": "trace-b", "d3": ""}


def test_an_invalid_event_is_dead_lettered_under_its_trace_id(consumer, logs):
    raw = envelope(payload={"doc_id": "d1"})  # no text
    raw["meta"]["trace_id"] = "trace-bad"
    msg = FakeMsg(raw)
    (result,) = asyncio.run(consumer.handle([msg]))
    assert result.status == "invalid" and result.trace_id == "trace-bad"
    assert msg.settled == ["term"]
    ((subject, _),) = consumer.js.published
    assert subject == consumer.cfg.dlq_subject("doc.upserted")
    (dead,) = [r for r in consumer_records(logs) if r.getMessage().startswith("dead-lettered")]
    assert dead.trace_id == "trace-bad"  # type: ignore[attr-defined]
    assert consumer.nc.published == []


@pytest.mark.parametrize("given", ["x" * 129, "tab\there"])
def test_an_x_trace_id_that_does_not_fit_the_audit_column_is_replaced(given):
    from serve_app.testing import build_gateway

    gw = build_gateway()
    r = gw.client.get("/healthz", headers={"x-trace-id": given})
    assert r.headers["x-trace-id"] != given and len(r.headers["x-trace-id"]) == 32
