"""The write barrier on a PostgreSQL state database (advisory locks), as a cluster runs it:
two engines stand for two processes (an ingress replica and the reindex job)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from batch_ingest.write_barrier import WriteBarrier
from deployments.errors import BackendUnavailable
from tests.integration.test_audit_postgres import postgres_url

pytestmark = pytest.mark.integration


@pytest.fixture
def barriers():
    url = postgres_url()
    engines = [sa.create_engine(url) for _ in range(2)]
    yield [WriteBarrier(e, wait_s=1.0) for e in engines]
    for e in engines:
        e.dispose()


def test_a_switch_waits_for_a_writer_of_another_process_and_pauses_new_ones(barriers):
    writer, job = barriers
    team = f"pg_{uuid.uuid4().hex[:8]}"
    release = writer.acquire_shared([team])
    # Writers share the team; the job cannot switch while one is in flight.
    writer.acquire_shared([team])()
    with pytest.raises(BackendUnavailable, match="did not pause"), job.switching(team, 0.3):
        pass
    entered = threading.Event()

    def switch() -> None:
        with job.switching(team, 5):
            entered.set()
            time.sleep(0.3)

    thread = threading.Thread(target=switch)
    thread.start()
    time.sleep(0.2)
    assert not entered.is_set()
    release()
    assert entered.wait(5)
    # While the job holds the team a writer waits, and gives up with a 503 after wait_s.
    writer.wait_s = 0.1
    with pytest.raises(BackendUnavailable, match="switching"):
        writer.acquire_shared([team])
    thread.join(5)
    writer.wait_s = 1.0
    writer.acquire_shared([team])()  # after the switch writes go on
