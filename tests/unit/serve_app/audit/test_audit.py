"""The audit log: the store (SQLite), the asynchronous writer, the decisions the gateway
records, GET /audit/decisions and its permission check, and the CLI."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from batch_ingest.audit_store import AuditRecord, AuditStore
from batch_ingest.settings import AuditSettings
from serve_app.audit.log import AuditLog, main, parse_time, sha256_text
from serve_app.testing import (
    TENANCY_POLICY,
    build_gateway,
    claims,
    mint,
    tenancy_corpus,
)

pytestmark = pytest.mark.usefixtures("clean_gateway_env")

QUERY = {"team_id": "dao_a", "query": "Milvus gateway search notes", "top_k": 5}


def rec(**fields: Any) -> AuditRecord:
    base: dict[str, Any] = {
        "action": "search",
        "decision": "allow",
        "reason": "granted",
        "http_status": 200,
    }
    return AuditRecord(**(base | fields))


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'audit.db'}"


@pytest.fixture
def store(url) -> AuditStore:
    store = AuditStore(url)
    yield store
    store.dispose()


def fast(url: str, **overrides: Any) -> AuditSettings:
    return AuditSettings(url=url, flush_interval_s=0.02, retry_interval_s=0.05, **overrides)


# --- the store ---------------------------------------------------------------------------


def test_store_round_trips_a_record_with_utc_time_and_json_ids(store):
    ts = datetime(2026, 11, 30, 8, 0, 1, 250000, tzinfo=UTC)
    store.insert([rec(ts=ts, subject="alice", chunk_ids=["c1", "c2"], query_sha256="ab" * 32)])
    (row,) = store.query()
    assert row["ts"] == ts and row["ts"].tzinfo is not None
    assert row["chunk_ids"] == ["c1", "c2"]
    assert row["subject"] == "alice" and row["decision"] == "allow"


def test_store_has_the_indexes_for_time_subject_decision_and_team(store):
    store.create()
    import sqlalchemy as sa

    indexes = {
        tuple(i["column_names"]) for i in sa.inspect(store.engine).get_indexes(store.table.name)
    }
    assert {("ts",), ("subject", "ts"), ("decision", "ts"), ("team_id", "ts")} <= indexes


def test_query_filters_by_time_subject_decision_and_team_newest_first(store):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.insert(
        [
            rec(ts=t0, subject="alice", team_id="dao_a"),
            rec(ts=t0 + timedelta(hours=1), subject="bob", team_id="dao_b", decision="deny"),
            rec(ts=t0 + timedelta(hours=2), subject="alice", team_id="dao_a", decision="deny"),
            rec(ts=t0 + timedelta(hours=3), subject="alice", team_id="dao_b"),
        ]
    )
    assert [r["subject"] for r in store.query(subject="bob")] == ["bob"]
    denied = store.query(decision="deny")
    assert [r["ts"] for r in denied] == [t0 + timedelta(hours=2), t0 + timedelta(hours=1)]
    window = store.query(since=t0 + timedelta(hours=1), until=t0 + timedelta(hours=3))
    assert len(window) == 2
    assert len(store.query(team_id="dao_a", subject="alice")) == 2
    assert len(store.query(limit=1)) == 1
    # A naive datetime is taken as UTC; another offset is converted.
    assert len(store.query(since=datetime(2026, 1, 1, 2, 30))) == 1
    east = datetime(2026, 1, 1, 4, 30, tzinfo=__import__("datetime").timezone(timedelta(hours=2)))
    assert len(store.query(since=east)) == 1
    with pytest.raises(ValueError, match="decision"):
        store.query(decision="maybe")


def test_audit_settings_come_from_the_environment(monkeypatch):
    from serve_app.settings import GatewaySettings

    monkeypatch.delenv("AUDIT__URL", raising=False)
    default = GatewaySettings().audit
    assert default.enabled and default.url == "sqlite:///var/audit.db"
    assert not default.store_query_text
    monkeypatch.setenv("AUDIT__URL", "postgresql+psycopg://u:p@127.0.0.1:5433/rag_audit")
    monkeypatch.setenv("AUDIT__ENABLED", "false")
    monkeypatch.setenv("AUDIT__BATCH_SIZE", "7")
    audit = GatewaySettings().audit
    assert audit.url.startswith("postgresql+psycopg://") and not audit.enabled
    assert audit.batch_size == 7


def test_relative_sqlite_path_is_under_the_repository(tmp_path):
    from batch_ingest.sql import ROOT, resolve_url

    assert resolve_url("sqlite:///var/audit.db") == f"sqlite:///{ROOT / 'var' / 'audit.db'}"
    assert resolve_url(f"sqlite:///{tmp_path}/x.db") == f"sqlite:///{tmp_path}/x.db"


# --- the asynchronous writer ---------------------------------------------------------------


def test_records_are_written_in_the_background_and_flushed(url, store):
    log = AuditLog(fast(url, batch_size=3))
    for i in range(10):
        log.record(rec(subject=f"u{i}"))
    assert log.flush(5)
    assert len(store.query(limit=100)) == 10
    assert log.written == 10
    log.close()


def test_close_writes_everything_still_queued(url, store):
    # A long interval: nothing would be written before close() without the final flush.
    log = AuditLog(AuditSettings(url=url, flush_interval_s=30, batch_size=1000))
    for i in range(25):
        log.record(rec(subject=f"u{i}"))
    log.close()
    assert len(store.query(limit=100)) == 25
    # After close a record is written synchronously rather than lost.
    log.record(rec(subject="late"))
    assert store.query(subject="late")


def test_raw_query_text_is_kept_only_when_configured(url, store):
    log = AuditLog(fast(url))
    log.record(rec(subject="a", query_sha256=sha256_text("secret"), query_text="secret"))
    log.close()
    (row,) = store.query()
    assert row["query_text"] is None and row["query_sha256"] == sha256_text("secret")
    log = AuditLog(fast(url, store_query_text=True))
    log.record(rec(subject="b", query_text="kept"))
    log.close()
    assert store.query(subject="b")[0]["query_text"] == "kept"


class FlakyStore:
    """An AuditStore whose database is down until ``up`` is set."""

    backend = "sqlite"

    def __init__(self, real: AuditStore) -> None:
        self.real = real
        self.up = threading.Event()
        self.calls = 0

    def insert(self, records):
        self.calls += 1
        if not self.up.is_set():
            raise ConnectionError("connection refused")
        self.real.insert(records)

    def ping(self):
        if not self.up.is_set():
            raise ConnectionError("connection refused")

    def query(self, *args, **kwargs):
        return self.real.query(*args, **kwargs)


def test_database_down_degrades_then_recovers_without_losing_records(store, url):
    flaky = FlakyStore(store)
    log = AuditLog(fast(url), store=flaky)
    started = time.perf_counter()
    for i in range(5):
        log.record(rec(subject=f"u{i}"))
    assert time.perf_counter() - started < 0.5  # the request path never waits on the db
    deadline = time.monotonic() + 5
    while log.healthy and time.monotonic() < deadline:
        time.sleep(0.01)
    status = log.status()
    assert status["ready"] is False and status["degraded"] is True
    assert "ConnectionError" in status["error"]
    assert status["pending"] == 5
    flaky.up.set()
    assert log.flush(5)
    assert len(store.query()) == 5
    assert log.status()["ready"] is True
    log.close()


def test_queue_bounded_while_the_database_is_down(store, url):
    flaky = FlakyStore(store)
    log = AuditLog(fast(url, max_pending=3, shutdown_timeout_s=0.5), store=flaky)
    for i in range(10):
        log.record(rec(subject=f"u{i}"))
    assert log.dropped >= 7
    flaky.up.set()
    log.close()
    # The newest records are kept.
    assert {r["subject"] for r in store.query()} == {"u7", "u8", "u9"}


def test_prune_deletes_only_records_older_than_the_cutoff_a_batch_at_a_time(store):
    now = datetime.now(UTC)
    store.insert([rec(subject=f"old{i}", ts=now - timedelta(days=100 + i)) for i in range(7)])
    store.insert([rec(subject=f"new{i}", ts=now - timedelta(days=i)) for i in range(3)])
    cutoff = now - timedelta(days=90)
    # The oldest first, at most one batch per call; fewer than a batch: none older left.
    assert store.prune(cutoff, batch=3) == 3
    assert {r["subject"] for r in store.query(limit=100)} == {
        "old0",
        "old1",
        "old2",
        "old3",
        "new0",
        "new1",
        "new2",
    }
    assert store.prune(cutoff, batch=3) == 3
    assert store.prune(cutoff, batch=3) == 1
    assert store.prune(cutoff, batch=3) == 0
    assert {r["subject"] for r in store.query(limit=100)} == {"new0", "new1", "new2"}


def test_writer_deletes_records_past_the_retention_and_keeps_the_rest(url, store):
    now = datetime.now(UTC)
    store.insert([rec(subject=f"old{i}", ts=now - timedelta(days=31 + i)) for i in range(12)])
    store.insert([rec(subject="recent", ts=now - timedelta(days=29))])
    log = AuditLog(fast(url, retention_days=30, prune_batch=5))
    log.record(rec(subject="fresh"))
    assert log.flush(5)
    deadline = time.monotonic() + 5
    while log.pruned < 12 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert log.pruned == 12
    assert {r["subject"] for r in store.query(limit=100)} == {"recent", "fresh"}
    status = log.status()
    assert status["pruned"] == 12 and status["retention_days"] == 30
    # Once per interval: an old record written now stays until the next one.
    log.record(rec(subject="late_old", ts=now - timedelta(days=60)))
    assert log.flush(5)
    time.sleep(0.1)
    assert store.query(subject="late_old")
    log.close()


def test_retention_zero_keeps_every_record(url, store):
    now = datetime.now(UTC)
    store.insert([rec(subject="ancient", ts=now - timedelta(days=3650))])
    log = AuditLog(fast(url, retention_days=0))
    log.record(rec(subject="fresh"))
    assert log.flush(5)
    time.sleep(0.1)
    log.close()
    assert log.pruned == 0
    assert {r["subject"] for r in store.query(limit=100)} == {"ancient", "fresh"}


def test_a_failing_prune_is_reported_and_writes_go_on(url, store):
    log = AuditLog(fast(url, retention_days=1))

    def broken(before, batch=5000):
        raise RuntimeError("disk I/O error")

    log.store.prune = broken  # type: ignore[method-assign,union-attr]
    for i in range(3):
        log.record(rec(subject=f"u{i}"))
    assert log.flush(5)
    deadline = time.monotonic() + 5
    while log.prune_error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "disk I/O error" in log.status()["prune_error"]
    assert log.status()["ready"] is True  # the log itself is healthy
    assert len(store.query(limit=100)) == 3
    log.close()


def test_cli_prune_deletes_before_a_span(store, url, capsys):
    now = datetime.now(UTC)
    store.insert([rec(subject="old", ts=now - timedelta(days=40)), rec(subject="new")])
    assert main(["prune", "--url", url, "--before", "30d"]) == 0
    assert "1 records older than" in capsys.readouterr().out
    assert {r["subject"] for r in store.query(limit=100)} == {"new"}


def test_disabled_log_records_nothing():
    log = AuditLog(AuditSettings(enabled=False))
    log.record(rec())
    assert log.flush() and log.status() == {"ready": True, "enabled": False}


# --- decisions recorded by the gateway -----------------------------------------------------


def token(teams=None, **overrides) -> str:
    return mint(claims(teams=teams or {"dao_a": ["member"]}, **overrides))


@pytest.fixture
def gateway(url):
    gw = build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())
    gw.services.recorder.log = AuditLog(fast(url))
    yield gw
    gw.services.recorder.log.close()


def decisions(gateway, **filters) -> list[dict[str, Any]]:
    assert gateway.services.recorder.log.flush(5)
    return gateway.services.recorder.log.query(**filters)


def test_allowed_search_is_recorded_with_returned_chunk_ids_and_query_hash(gateway):
    response = gateway.search(QUERY | {"agent_id": "ag_x"}, token(), **{"x-trace-id": "t-1"})
    assert response.status_code == 200
    (row,) = decisions(gateway)
    assert row["decision"] == "allow" and row["action"] == "search"
    assert row["subject"] == "alice" and row["team_id"] == "dao_a"
    assert row["auth_method"] == "jwt" and row["http_status"] == 200
    assert row["trace_id"] == "t-1"
    assert row["chunk_ids"] == [m["chunk_id"] for m in response.json()["matches"]]
    assert row["chunk_ids"]
    assert row["query_sha256"] == sha256_text(QUERY["query"]) and row["query_text"] is None
    # A user token has no verified agent: the body's agent id is recorded as declared only.
    assert row["agent_id"] == "" and row["declared_agent_id"] == "ag_x"
    assert row["latency_ms"] is not None


def test_denied_search_is_recorded_with_its_reason(gateway):
    response = gateway.search(QUERY | {"mode": "confidential"}, token())
    assert response.status_code == 403
    (row,) = decisions(gateway)
    assert row["decision"] == "deny" and row["http_status"] == 403
    assert row["reason"] == response.json()["reason"] == "confidential_not_granted"
    assert row["chunk_ids"] is None

    gateway.search(QUERY | {"team_id": "dao_b"}, token())
    assert decisions(gateway, team_id="dao_b")[0]["reason"] == "team_not_granted"


def test_project_denied_by_policy_is_recorded_with_the_policy_reason(gateway):
    response = gateway.search(QUERY | {"filters": {"project_id": "prj_ops"}}, token())
    assert response.status_code == 403
    (row,) = decisions(gateway)
    assert row["reason"] == "not_in_allowed_groups"
    assert row["resource"] == "team:dao_a/project:prj_ops"


def test_unauthenticated_request_is_recorded_as_deny_with_unknown_subject(gateway):
    assert gateway.search(QUERY).status_code == 401
    assert gateway.search(QUERY, "not-a-token").status_code == 401
    rows = decisions(gateway)
    assert len(rows) == 2
    assert [r["auth_method"] for r in rows] == ["jwt", "none"]
    for row in rows:
        assert row["decision"] == "deny" and row["http_status"] == 401
        assert row["subject"] == "" and row["action"] == "search"
        assert row["path"] == "/rag/search_docs"


def test_allowed_ingest_is_recorded_per_document(gateway):
    owner = token({"dao_a": ["owner"]})
    docs = [
        {"team_id": "dao_a", "doc_id": "n1", "text": "one"},
        {"team_id": "dao_a", "doc_id": "n2", "text": "two", "project_id": "prj_open"},
    ]
    assert gateway.ingest(docs, owner).status_code == 200
    rows = decisions(gateway, action="ingest")
    assert sorted(r["doc_ids"][0] for r in rows) == ["n1", "n2"]
    assert {r["decision"] for r in rows} == {"allow"}
    assert "team:dao_a/project:prj_open/doc:n2" in {r["resource"] for r in rows}


def test_denied_ingest_is_recorded_naming_the_document(gateway):
    docs = [{"team_id": "dao_a", "doc_id": "n1", "text": "one"}]
    response = gateway.ingest(docs, token())  # a member may not write
    assert response.status_code == 403
    (row,) = decisions(gateway, action="ingest")
    assert row["decision"] == "deny" and row["reason"] == "write_not_granted"
    assert row["doc_ids"] == ["n1"] and row["team_id"] == "dao_a"


def test_ingest_refused_for_its_size_is_recorded_with_its_status(gateway):
    gateway.services.settings.ingest.max_documents = 1
    owner = token({"dao_a": ["owner"]})
    docs = [{"team_id": "dao_a", "doc_id": f"n{i}", "text": "x"} for i in range(2)]
    assert gateway.ingest(docs, owner).status_code == 422
    (row,) = decisions(gateway, action="ingest")
    assert (row["decision"], row["http_status"]) == ("allow", 422)
    assert row["reason"] == "granted;invalid_input" and row["doc_ids"] == ["n0", "n1"]


def test_request_answers_when_the_audit_database_is_down(gateway, store):
    flaky = FlakyStore(store)
    gateway.services.recorder.log = AuditLog(fast("sqlite://"), store=flaky)
    assert gateway.search(QUERY, token()).status_code == 200
    ready = gateway.client.get("/readyz")
    assert ready.status_code == 200  # audit is reported, not required, by default
    body = ready.json()
    assert body["components"]["audit"]["ready"] is False
    assert body["degraded"] == ["audit"]
    flaky.up.set()
    assert gateway.services.recorder.log.flush(5)
    assert store.query()[0]["action"] == "search"


def test_readyz_requires_audit_when_configured(url, store):
    gw = build_gateway(policy=TENANCY_POLICY)
    gw.services.settings.audit.required_for_ready = True
    gw.services.recorder.log = AuditLog(fast(url), store=FlakyStore(store))
    response = gw.client.get("/readyz")
    assert response.status_code == 503
    assert "audit" in response.json()["not_ready"]


# --- GET /audit/decisions ----------------------------------------------------------------


def get(gateway, token_: str | None = None, **params) -> Any:
    headers = {"authorization": f"Bearer {token_}"} if token_ else {}
    return gateway.client.get("/audit/decisions", params=params, headers=headers)


def test_endpoint_needs_the_audit_read_permission(gateway):
    gateway.search(QUERY | {"mode": "confidential"}, token())
    response = get(gateway, token())
    assert response.status_code == 403
    assert response.json()["reason"] == "audit_read_not_granted"
    auditor = mint(claims(sub="auditor", teams={}, permissions=["audit:read"]))
    assert gateway.services.recorder.log.flush(5)
    response = get(gateway, auditor, decision="deny", subject="alice")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == 2
    assert [d["reason"] for d in body["decisions"]] == [
        "audit_read_not_granted",
        "confidential_not_granted",
    ]
    # The reads themselves are decisions too.
    reads = decisions(gateway, action="audit.read")
    assert [(r["subject"], r["decision"]) for r in reads] == [
        ("auditor", "allow"),
        ("alice", "deny"),
    ]


def test_team_owner_reads_only_its_own_team(gateway):
    gateway.search(QUERY, token())
    gateway.search(QUERY | {"team_id": "dao_b"}, token({"dao_b": ["member"]}))
    assert gateway.services.recorder.log.flush(5)
    owner = token({"dao_a": ["owner"]})
    response = get(gateway, owner, team_id="dao_a")
    assert response.status_code == 200
    assert {d["team_id"] for d in response.json()["decisions"]} == {"dao_a"}
    assert get(gateway, owner, team_id="dao_b").status_code == 403
    assert get(gateway, owner).status_code == 403  # every team needs the permission


def test_an_unreadable_audit_database_is_503_naming_the_audit_log(gateway, monkeypatch):
    auditor = mint(claims(sub="auditor", permissions=["audit:read"]))

    def broken(*args):
        raise ConnectionError("database is gone")

    monkeypatch.setattr(gateway.services.recorder.log, "query", broken)
    response = get(gateway, auditor)
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["error"] == "backend_unavailable"
    assert body["message"] == "audit: database unavailable: ConnectionError"


def test_endpoint_without_credentials_is_401(gateway):
    assert get(gateway).status_code == 401


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"decision": "maybe"}, "query.decision"),
        ({"since": "yesterday"}, "query.since"),
        ({"limit": 0}, "query.limit"),
        ({"limit": 100000}, "limit"),
        ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
    ],
)
def test_bad_parameters_are_422_naming_the_field(gateway, params, field):
    auditor = mint(claims(sub="auditor", permissions=["audit:read"]))
    response = get(gateway, auditor, **params)
    assert response.status_code == 422, response.text
    assert field in {f["field"] for f in response.json()["fields"]}


def test_dev_mode_reads_without_credentials_outside_production(url):
    gw = build_gateway(auth={"mode": "dev"})
    gw.services.recorder.log = AuditLog(fast(url))
    gw.search(QUERY | {"user_id": "dev_user"})
    assert gw.services.recorder.log.flush(5)
    response = get(gw, since="2000-01-01T00:00:00Z", decision="allow")
    assert response.status_code == 200
    assert "dev_user" in {d["subject"] for d in response.json()["decisions"]}
    gw.services.recorder.log.close()


# --- CLI -----------------------------------------------------------------------------------


def test_cli_queries_by_decision_and_time(store, url, capsys):
    now = datetime.now(UTC)
    store.insert(
        [
            rec(ts=now - timedelta(hours=3), subject="old", decision="deny"),
            rec(ts=now - timedelta(minutes=5), subject="new", decision="deny"),
            rec(ts=now - timedelta(minutes=5), subject="ok"),
        ]
    )
    assert (
        main(["query", "--url", url, "--since", "1h", "--decision", "deny", "--format", "json"])
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["subject"] for r in rows] == ["new"]
    assert main(["query", "--url", url, "--subject", "ok"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ts\tdecision") and len(out) == 2


def test_parse_time_accepts_iso_and_relative_spans():
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert parse_time("2h", now) == datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert parse_time("2026-11-30T08:00:00Z") == datetime(2026, 11, 30, 8, tzinfo=UTC)
    assert parse_time("2026-11-30T08:00:00") == datetime(2026, 11, 30, 8, tzinfo=UTC)


def test_a_table_of_an_older_gateway_gains_the_new_columns(url):
    """The ``groups`` column came with document ACLs: an audit database created before it is
    migrated in place (nullable column added) and keeps its rows."""
    import sqlalchemy as sa

    old = AuditStore(url)
    old.table = old.table.to_metadata(sa.MetaData())
    old.table._columns.remove(old.table.c.groups)
    old.table.metadata.create_all(old.engine)
    with old.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO audit_decisions (ts, trace_id, subject, auth_method, key_id, "
                "agent_id, declared_agent_id, team_id, action, resource, decision, reason, "
                "http_status, path) VALUES ('2026-11-30 08:00:00', 't', 'old', '', '', '', '', "
                "'dao', 'search', '', 'allow', 'ok', 200, '')"
            )
        )
    old.dispose()
    store = AuditStore(url)
    store.insert([rec(subject="new", groups=["hr"])])
    rows = {r["subject"]: r for r in store.query()}
    assert rows["old"]["groups"] is None
    assert rows["new"]["groups"] == ["hr"]
    store.dispose()


def test_a_naive_and_an_offset_bound_compare_and_an_empty_window_answers_empty(gateway):
    auditor = mint(claims(sub="auditor", permissions=["audit:read"]))
    gateway.search(QUERY, token())
    assert gateway.services.recorder.log.flush(5)
    # Naive means UTC; comparing it with an aware bound was a TypeError (500).
    wide = get(gateway, auditor, since="2000-01-01T00:00:00", until="2200-01-01T00:00:00Z")
    assert wide.status_code == 200, wide.text
    assert wide.json()["count"] >= 1
    # [since, until) with since == until holds nothing: an empty answer, not a 422.
    empty = get(gateway, auditor, since="2000-01-01T00:00:00Z", until="2000-01-01T01:00:00+01:00")
    assert empty.status_code == 200 and empty.json()["count"] == 0, empty.text


@pytest.mark.parametrize(
    "params", [{"since": "0001-01-01T00:00:00+01:00"}, {"until": "9999-12-31T23:59:59-01:00"}]
)
def test_an_instant_outside_the_years_1_to_9999_in_utc_is_422_not_503(gateway, params):
    # The conversion to UTC overflowed in the database layer: a 503 blaming the audit log.
    auditor = mint(claims(sub="auditor", permissions=["audit:read"]))
    response = get(gateway, auditor, **params)
    assert response.status_code == 422, response.text
    (field,) = params
    assert response.json()["fields"][0]["field"] == field


def test_a_table_created_meanwhile_by_another_writer_is_used_not_an_error(url, monkeypatch):
    """A fresh database: another store (another thread or replica) creates the table between
    this store's existence check and its CREATE. The first query and insert still work."""
    first, second = AuditStore(url), AuditStore(url)
    create_all = second.metadata.create_all

    def raced(engine, checkfirst=True):
        first.create()  # the other writer wins the race
        create_all(engine, checkfirst=False)  # this one's CREATE then finds the table

    monkeypatch.setattr(second.metadata, "create_all", raced)
    assert second.query() == []
    second.insert([rec()])
    assert len(first.query()) == 1


def test_the_first_insert_and_the_first_query_race_to_create_the_table(url):
    """The writer thread's first insert and a request's first query on a fresh database,
    at once, many times: neither fails (each store creates its table once)."""
    for i in range(20):
        store = AuditStore(url.replace("audit.db", f"race{i}.db"))
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def run(call, store=store, errors=errors, start=start):
            start.wait()
            try:
                call()
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(lambda s=store: s.insert([rec()]),)),
            threading.Thread(target=run, args=(lambda s=store: s.query(),)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
