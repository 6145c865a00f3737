"""The per-team write barrier (batch_ingest/write_barrier.py): writers share a team, a switch
holds it alone, waits are bounded, and SQLite state files lock across processes."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import sqlalchemy as sa

from batch_ingest.write_barrier import WriteBarrier
from deployments.errors import BackendUnavailable


@pytest.fixture(params=["file", "memory"])
def barrier(request, tmp_path) -> WriteBarrier:
    url = f"sqlite:///{tmp_path}/state.db" if request.param == "file" else "sqlite://"
    return WriteBarrier(sa.create_engine(url), wait_s=2.0)


def test_writers_share_a_team_and_other_teams_are_independent(barrier):
    first = barrier.acquire_shared(["t1"])
    second = barrier.acquire_shared(["t1", "t2"])
    with barrier.switching("t3", wait_s=0.5):
        pass  # another team is not held by them
    second()
    first()


def test_a_switch_waits_for_the_writes_in_flight(barrier):
    release = barrier.acquire_shared(["t1"])
    entered = threading.Event()

    def switch() -> None:
        with barrier.switching("t1", wait_s=5):
            entered.set()

    thread = threading.Thread(target=switch)
    thread.start()
    time.sleep(0.2)
    assert not entered.is_set()  # the write is still in flight
    release()
    thread.join(5)
    assert entered.is_set()


def test_writers_wait_during_a_switch_and_go_on_after_it(barrier):
    order: list[str] = []
    with barrier.switching("t1", wait_s=1):

        def write() -> None:
            release = barrier.acquire_shared(["t1"])
            order.append("write")
            release()

        thread = threading.Thread(target=write)
        thread.start()
        time.sleep(0.2)
        order.append("switched")
    thread.join(5)
    assert order == ["switched", "write"]


def test_a_writer_gives_up_with_a_503_naming_the_switch(barrier):
    barrier.wait_s = 0.2
    with barrier.switching("t1", wait_s=1), pytest.raises(BackendUnavailable) as err:
        barrier.acquire_shared(["t0", "t1"])
    assert err.value.status_code == 503
    assert "switching to a reindexed collection" in err.value.message
    # What it held already (t0) was released: a switch of t0 goes through at once.
    with barrier.switching("t0", wait_s=0.2):
        pass


def test_a_switch_gives_up_when_writes_do_not_pause(barrier):
    release = barrier.acquire_shared(["t1"])
    with pytest.raises(BackendUnavailable, match="did not pause"), barrier.switching("t1", 0.2):
        pass
    release()
    # The gate it took was released: writers are not blocked by the failed switch.
    barrier.acquire_shared(["t1"])()


def test_a_stream_of_overlapping_writers_does_not_starve_a_switch(barrier):
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            try:
                release = barrier.acquire_shared(["t1"])
            except BackendUnavailable:
                continue
            time.sleep(0.02)
            release()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.1)
        started = time.monotonic()
        with barrier.switching("t1", wait_s=2):
            waited = time.monotonic() - started
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    assert waited < 1.0


def _hold_shared(path: str, held, release) -> None:
    barrier = WriteBarrier(sa.create_engine(f"sqlite:///{path}"), wait_s=5)
    done = barrier.acquire_shared(["t1"])
    held.set()
    release.wait(10)
    done()


def test_sqlite_state_files_lock_across_processes(tmp_path):
    path = str(tmp_path / "state.db")
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    process = ctx.Process(target=_hold_shared, args=(path, held, release))
    process.start()
    try:
        assert held.wait(30)
        barrier = WriteBarrier(sa.create_engine(f"sqlite:///{path}"), wait_s=1)
        with pytest.raises(BackendUnavailable), barrier.switching("t1", wait_s=0.3):
            pass
        release.set()
        process.join(10)
        with barrier.switching("t1", wait_s=2):
            pass
    finally:
        release.set()
        process.join(10)
