"""IndexGenerations.read_now: a SQLite state database's generation read on the caller's
thread, never waiting — every committed bump seen at once, None (so the caller makes the
threaded ``get``) while a writer holds the file or for any other backend."""

from __future__ import annotations

import asyncio
import sqlite3

import sqlalchemy as sa

from batch_ingest.generations import IndexGenerations
from serve_app.search.cache.shared_reads import SharedReads


def test_a_direct_read_sees_every_commit_of_another_writer(tmp_path):
    url = f"sqlite:///{tmp_path / 'state db #1.db'}"  # a path a URI must escape
    reader = IndexGenerations(sa.create_engine(url))
    writer = IndexGenerations(sa.create_engine(url))
    assert reader.read_now("t1") == 0  # never written
    for expected in (1, 2, 3):
        writer.bump(["t1"])
        assert reader.read_now("t1") == expected == reader.get("t1")
    assert reader.read_now("t2") == 0


def test_a_locked_file_answers_none_at_once_and_the_shared_read_waits_for_it(tmp_path):
    path = tmp_path / "state.db"
    gens = IndexGenerations(sa.create_engine(f"sqlite:///{path}"))
    gens.bump(["t1"])
    assert gens.read_now("t1") == 1
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # a writer in the middle of its commit
    lock.execute("UPDATE team_generations SET generation = 7")
    assert gens.read_now("t1") is None

    async def read_through_the_thread() -> int:
        reads = SharedReads(gens.get, gens.read_now)
        task = asyncio.ensure_future(reads.get("t1"))
        await asyncio.sleep(0.2)
        assert not task.done()  # waiting in its worker thread, not on the event loop
        lock.execute("COMMIT")
        value = await task
        assert (reads.reads, reads.direct) == (1, 0)
        return value

    assert asyncio.run(read_through_the_thread()) == 7
    assert gens.read_now("t1") == 7


def test_other_backends_read_through_get_only(tmp_path):
    engine = sa.create_engine(
        "sqlite://", poolclass=sa.pool.StaticPool, connect_args={"check_same_thread": False}
    )
    memory = IndexGenerations(engine)
    memory.bump(["t1"])
    assert memory.read_now("t1") is None and memory.get("t1") == 1

    reads = SharedReads(memory.get, memory.read_now)
    assert asyncio.run(reads.get("t1")) == 1
    assert (reads.reads, reads.direct) == (1, 0)
