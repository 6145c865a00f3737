"""Background ingestion jobs: a request too long for one HTTP request is stored, answered 202
with a job id, indexed by the replica's worker, and its state readable only by its submitter;
a job survives the replica that claimed it (lease expiry) and waits out a backend outage."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from batch_ingest.documents import SourceDocument
from batch_ingest.jobs import IngestJobs
from batch_ingest.source_store import SourceStore
from deployments.errors import BackendUnavailable
from serve_app.ingest.worker import JobWorker
from serve_app.testing import build_gateway, claims, mint

TEAM = "dao_jobs"
TEXT = "Solar panels feed the district grid; batteries store the surplus. " * 40  # ~2.6k chars


def auth(sub: str = "user_1", team: str = TEAM) -> dict[str, str]:
    return {"authorization": f"Bearer {mint(claims(sub=sub, teams={team: ['service']}))}"}


def doc(doc_id: str, text: str = TEXT) -> dict:
    return {"team_id": TEAM, "doc_id": doc_id, "title": doc_id, "text": text}


@pytest.fixture
def gateway(tmp_path):
    return build_gateway(
        state_url=f"sqlite:///{tmp_path / 'state.db'}", ingest={"sync_max_chars": 1000}
    )


def wait_done(client, url: str, headers: dict[str, str], timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(url, headers=headers).json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"job not finished: {body}")


def test_a_long_request_is_accepted_as_a_job_and_indexed(gateway):
    with gateway.client as client:  # the lifespan runs the job worker
        r = client.post("/ingest/documents", json={"documents": [doc("long")]}, headers=auth())
        assert r.status_code == 202, r.text
        accepted = r.json()
        assert accepted["status"] == "queued" and accepted["documents"] == 1
        assert accepted["chars"] == len(TEXT) and r.headers["location"] == accepted["status_url"]
        body = wait_done(client, accepted["status_url"], auth())
    assert body["status"] == "done", body
    assert body["result"]["indexed"] == 1 and body["result"]["documents"][0]["chunks"] > 1
    assert body["trace_id"] == accepted["trace_id"] == body["result"]["trace_id"]
    n = body["result"]["documents"][0]["chunks"]
    assert asyncio.run(gateway.store.count(TEAM)) == n


def test_a_short_request_stays_synchronous_unless_async_is_preferred(gateway):
    with gateway.client as client:
        short = doc("short", "A short note about the grid operator.")
        r = client.post("/ingest/documents", json={"documents": [short]}, headers=auth())
        assert r.status_code == 200 and r.json()["indexed"] == 1
        r = client.post(
            "/ingest/documents",
            json={"documents": [doc("short2", "Another short note.")]},
            headers={**auth(), "prefer": "respond-async"},
        )
        assert r.status_code == 202 and r.headers["preference-applied"] == "respond-async"
        assert wait_done(client, r.json()["status_url"], auth())["status"] == "done"


def test_only_the_submitter_sees_a_job(gateway):
    with gateway.client as client:
        r = client.post("/ingest/documents", json={"documents": [doc("mine")]}, headers=auth())
        url = r.json()["status_url"]
        other = client.get(url, headers=auth(sub="user_2"))
        assert other.status_code == 404 and other.json()["error"] == "not_found"
        unknown = client.get("/ingest/jobs/" + "0" * 32, headers=auth())
        assert unknown.status_code == 404
        assert client.get(url).status_code == 401
        assert wait_done(client, url, auth())["status"] == "done"


def test_a_refused_request_stores_no_job(gateway):
    with gateway.client as client:
        r = client.post(
            "/ingest/documents", json={"documents": [doc("x")]}, headers=auth(team="dao_other")
        )
        assert r.status_code == 403
    assert IngestJobs(gateway.services.pipeline.sources.engine).pending() == 0


def source(doc_id: str) -> SourceDocument:
    return SourceDocument.model_validate(doc(doc_id))


def test_an_expired_lease_is_taken_over(tmp_path):
    jobs = IngestJobs(SourceStore(f"sqlite:///{tmp_path / 's.db'}").engine)
    job = jobs.submit([source("a")], "jwt:u", "t1")
    first = jobs.claim("replica-1", lease_s=60)
    assert first is not None and first[0].job_id == job.job_id
    assert jobs.claim("replica-2", lease_s=60) is None  # held
    with jobs.engine.begin() as conn:  # replica-1 died: its lease runs out
        conn.execute(
            sa.update(jobs.table).values(lease_expires=datetime.now(UTC) - timedelta(seconds=1))
        )
    second = jobs.claim("replica-2", lease_s=60)
    assert second is not None and second[0].attempts == 2
    assert [d.doc_id for d in second[1]] == ["a"]
    assert not jobs.finish(job.job_id, "replica-1", {})  # the old owner cannot finish it
    assert jobs.finish(job.job_id, "replica-2", {"ok": True})
    done = jobs.get(job.job_id)
    assert done is not None and done.status == "done" and done.result == {"ok": True}


def test_a_backend_outage_requeues_the_job_and_it_finishes_later(tmp_path):
    jobs = IngestJobs(SourceStore(f"sqlite:///{tmp_path / 's.db'}").engine)
    calls = []

    async def process(job, docs):
        calls.append(job.attempts)
        if len(calls) == 1:
            raise BackendUnavailable("milvus", "connection refused")
        return {"indexed": len(docs)}

    async def run():
        worker = JobWorker(jobs, process, lease_s=30)
        job = await asyncio.to_thread(jobs.submit, [source("b")], "jwt:u", "t2")
        assert await worker.run_one()
        queued = jobs.get(job.job_id)
        assert queued is not None and queued.status == "queued" and "milvus" in queued.error
        assert not await worker.run_one()  # not due yet (retry_at in the future)
        with jobs.engine.begin() as conn:
            conn.execute(sa.update(jobs.table).values(retry_at=datetime.now(UTC)))
        assert await worker.run_one()
        return jobs.get(job.job_id)

    done = asyncio.run(run())
    assert done is not None and done.status == "done" and done.result == {"indexed": 1}
    assert calls == [1, 2]


def test_a_job_that_keeps_failing_on_a_bug_is_failed_with_its_error(tmp_path):
    jobs = IngestJobs(SourceStore(f"sqlite:///{tmp_path / 's.db'}").engine)

    async def process(job, docs):
        raise ValueError("broken chunker")

    async def run():
        job = await asyncio.to_thread(jobs.submit, [source("c")], "jwt:u", "t3")
        assert await JobWorker(jobs, process).run_one()
        return jobs.get(job.job_id)

    failed = asyncio.run(run())
    assert failed is not None and failed.status == "failed"
    assert failed.error == "ValueError: broken chunker"
