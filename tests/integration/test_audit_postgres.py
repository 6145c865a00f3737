"""The audit log against the real PostgreSQL started by scripts/services.py (127.0.0.1:5433).

Fails (never skips) when the server is not running, like the other integration tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import pytest
import sqlalchemy as sa

from batch_ingest.audit_store import AuditRecord, AuditStore
from batch_ingest.settings import AuditSettings
from serve_app.audit.log import AuditLog
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus
from tests.conftest import port_open

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def postgres_url() -> str:
    url = (
        os.environ.get("RAG_TEST_POSTGRES_URL")
        or subprocess.check_output(
            [sys.executable, str(ROOT / "scripts" / "services.py"), "url", "postgres"], text=True
        ).strip()
    )
    parsed = urlparse(url.replace("postgresql+psycopg", "postgresql"))
    if not port_open(parsed.hostname or "127.0.0.1", parsed.port or 5432):
        pytest.fail(
            f"PostgreSQL is not running at {parsed.hostname}:{parsed.port}; start it with "
            "`.venv/bin/python scripts/services.py up` (scripts/test.sh does this)",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="module")
def url() -> str:
    return postgres_url()


@pytest.fixture
def table(run_id: str, request) -> str:
    return f"audit_it_{run_id}_{abs(hash(request.node.name)) % 10**6}"


@pytest.fixture
def store(url: str, table: str):
    store = AuditStore(url, table)
    yield store
    store.table.drop(store.engine, checkfirst=True)
    store.dispose()


def rec(**fields) -> AuditRecord:
    base = {"action": "search", "decision": "allow", "reason": "granted", "http_status": 200}
    return AuditRecord(**(base | fields))


def test_schema_round_trip_and_indexes_on_postgres(store):
    assert store.backend == "postgresql"
    ts = datetime(2026, 11, 30, 8, 0, 1, 123456, tzinfo=UTC)
    store.insert([rec(ts=ts, subject="alice", chunk_ids=["c1", "c2"], team_id="dao_a")])
    (row,) = store.query()
    assert row["ts"] == ts and row["chunk_ids"] == ["c1", "c2"]
    indexes = {
        tuple(i["column_names"]) for i in sa.inspect(store.engine).get_indexes(store.table.name)
    }
    assert {("ts",), ("subject", "ts"), ("decision", "ts"), ("team_id", "ts")} <= indexes
    with pytest.raises(sa.exc.IntegrityError):
        store.insert([rec(decision="maybe")])


def test_query_by_time_subject_decision_and_team_on_postgres(store):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.insert(
        [
            rec(
                ts=t0 + timedelta(minutes=i),
                subject=f"u{i % 3}",
                team_id=f"t{i % 2}",
                decision="deny" if i % 4 == 0 else "allow",
            )
            for i in range(40)
        ]
    )
    assert len(store.query(limit=1000)) == 40
    assert {r["subject"] for r in store.query(subject="u1", limit=1000)} == {"u1"}
    denied = store.query(decision="deny", limit=1000)
    assert len(denied) == 10 and denied[0]["ts"] > denied[-1]["ts"]
    window = store.query(since=t0 + timedelta(minutes=10), until=t0 + timedelta(minutes=20))
    assert len(window) == 10
    assert len(store.query(team_id="t0", decision="deny", limit=1000)) == 10


def test_writer_prunes_records_past_the_retention_on_postgres(url, table, store):
    now = datetime.now(UTC)
    store.insert([rec(subject=f"old{i}", ts=now - timedelta(days=91 + i)) for i in range(9)])
    store.insert([rec(subject="kept", ts=now - timedelta(days=89))])
    log = AuditLog(
        AuditSettings(url=url, table=table, flush_interval_s=0.05, prune_batch=4)
    )  # the default retention: 90 days
    log.record(rec(subject="fresh"))
    assert log.flush(5)
    deadline = time.monotonic() + 10  # the writer prunes after its write
    while log.pruned < 9 and time.monotonic() < deadline:
        time.sleep(0.02)
    log.close()
    assert log.pruned == 9
    assert {r["subject"] for r in store.query(limit=100)} == {"kept", "fresh"}


def test_writer_batches_concurrent_records_into_postgres(url, table, store):
    log = AuditLog(AuditSettings(url=url, table=table, flush_interval_s=0.05, batch_size=50))

    def burst(n: int) -> None:
        for i in range(100):
            log.record(rec(subject=f"w{n}", trace_id=f"{n}-{i}"))

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert len(store.query(limit=1000)) == 400
    assert log.status()["ready"] is True and log.status()["backend"] == "postgresql"


def test_unreachable_postgres_degrades_without_failing(table):
    bad = "postgresql+psycopg://rag_audit:x@127.0.0.1:1/rag_audit"
    log = AuditLog(AuditSettings(url=bad, table=table, flush_interval_s=0.05))
    log.record(rec())
    assert log.flush(3) is False
    status = log.status()
    assert status["ready"] is False and status["error"]
    log.settings.shutdown_timeout_s = 0.5
    log.close()


def test_gateway_decisions_land_in_postgres(url, table, store):
    gw = build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())
    gw.services.recorder.log = AuditLog(AuditSettings(url=url, table=table, flush_interval_s=0.05))
    member = mint(claims(teams={"dao_a": ["member"]}))
    ok = gw.search({"team_id": "dao_a", "query": "Milvus notes"}, member)
    assert ok.status_code == 200
    denied = gw.search({"team_id": "dao_b", "query": "x"}, mint(claims()))
    assert denied.status_code == 403
    assert gw.search({"team_id": "dao_a", "query": "x"}).status_code == 401
    gw.services.recorder.log.close()
    rows = store.query()
    assert [(r["decision"], r["http_status"]) for r in reversed(rows)] == [
        ("allow", 200),
        ("deny", 403),
        ("deny", 401),
    ]
    assert rows[-1]["chunk_ids"] == [m["chunk_id"] for m in ok.json()["matches"]]
