"""The per-team write barrier between the gateway's writers and a reindex switching the team's
alias: no write acknowledged before the switch is missing from the new version after it.

Every write of a team's chunks (``IngestPipeline.ingest`` and ``delete``, in the gateway and
in the bus consumer) runs holding the team's lock *shared*, from its first read of the store to
its source-registry record, which comes before its acknowledgement. A reindex takes the lock
*exclusively* for its last catch-up and the alias switch: it waits for the writes in flight to
finish, then reads the registry — every acknowledged write is in it — applies the tail to the
new version and switches, while new writes wait (a short, bounded wait: the tail needs no model
in the common case). After the switch they write through the alias into the new version.

A gate lock in front of the team lock keeps a stream of overlapping writers from starving the
switch: a writer passes the gate (shared, released at once) before taking the team lock; the
switch holds the gate exclusively, so new writers queue behind it.

Where the locks live follows the state database (``state.url``), the one store every writer
and the job already share: a SQLite file → ``fcntl`` locks on files beside it (one machine,
any number of processes); PostgreSQL → advisory locks (any number of nodes); anything else
(an in-memory database) → locks of this process.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool

from deployments.errors import BackendUnavailable

# How often a waiting lock is tried again.
POLL_S = 0.005


class _Locks(Protocol):
    """Try-locks by name: ``try_lock(name, exclusive)`` returns a release callable or None."""

    def try_lock(self, name: str, exclusive: bool) -> Callable[[], None] | None: ...


class _FileLocks:
    """``flock`` on ``<dir>/<name>.lock``: per open file, so threads and processes alike."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def try_lock(self, name: str, exclusive: bool) -> Callable[[], None] | None:
        fd = os.open(self.directory / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None

        def release() -> None:
            with suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

        return release


class _AdvisoryLocks:
    """PostgreSQL session advisory locks, each on a connection of its own while held."""

    def __init__(self, engine: Engine) -> None:
        # A connection per held lock, opened for it: writers in flight are not limited by
        # (nor do they exhaust) the registry's pool.
        self.engine = sa.create_engine(engine.url, poolclass=NullPool)

    def try_lock(self, name: str, exclusive: bool) -> Callable[[], None] | None:
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        kind = "" if exclusive else "_shared"
        conn = self.engine.connect()
        try:
            got = conn.execute(sa.text(f"SELECT pg_try_advisory_lock{kind}(:k)"), {"k": key})
            if not got.scalar():
                conn.close()
                return None
            conn.commit()
        except Exception:
            conn.close()
            raise

        def release() -> None:
            try:
                conn.execute(sa.text(f"SELECT pg_advisory_unlock{kind}(:k)"), {"k": key})
                conn.commit()
            finally:
                conn.close()

        return release


class _ProcessLocks:
    """Shared/exclusive locks of this process only (an in-memory state database)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held: dict[str, int] = {}  # name → readers (> 0) or -1 (a writer)

    def try_lock(self, name: str, exclusive: bool) -> Callable[[], None] | None:
        with self._mutex:
            held = self._held.get(name, 0)
            if (exclusive and held != 0) or (not exclusive and held < 0):
                return None
            self._held[name] = -1 if exclusive else held + 1

        def release() -> None:
            with self._mutex:
                held = self._held.get(name, 0)
                self._held[name] = 0 if held < 0 else max(held - 1, 0)

        return release


def _locks_for(engine: Engine) -> _Locks:
    url = make_url(str(engine.url))
    backend = url.get_backend_name()
    if backend == "sqlite" and url.database not in (None, "", ":memory:"):
        return _FileLocks(Path(f"{url.database}.locks"))
    if backend == "postgresql":
        return _AdvisoryLocks(engine)
    return _ProcessLocks()


class WriteBarrier:
    """The team locks of one state database.

    Args:
        engine: the state database's engine (``SourceStore.engine``).
        wait_s: how long a writer waits behind a switch before its write fails with a 503
            (nothing of it was written; the client retries).
    """

    def __init__(self, engine: Engine, *, wait_s: float = 30.0) -> None:
        self.locks = _locks_for(engine)
        self.wait_s = wait_s

    @staticmethod
    def _name(team_id: str, part: str) -> str:
        return f"team-{hashlib.sha256(team_id.encode()).hexdigest()[:32]}.{part}"

    def _acquire(self, name: str, exclusive: bool, deadline: float, why: str) -> Callable[[], None]:
        while True:
            release = self.locks.try_lock(name, exclusive)
            if release is not None:
                return release
            if time.monotonic() >= deadline:
                raise BackendUnavailable("reindex", why)
            time.sleep(POLL_S)

    def acquire_shared(self, team_ids: Iterable[str]) -> Callable[[], None]:
        """Hold every team of ``team_ids`` shared (sorted: no lock-order deadlock); returns
        the release. Raises ``BackendUnavailable`` after ``wait_s`` behind a switch."""
        deadline = time.monotonic() + self.wait_s
        held: list[Callable[[], None]] = []
        try:
            for team_id in sorted(set(team_ids)):
                why = (
                    f"team {team_id!r} is switching to a reindexed collection for longer than "
                    f"{self.wait_s:g}s; nothing was written, retry"
                )
                gate = self._acquire(self._name(team_id, "gate"), False, deadline, why)
                try:
                    held.append(self._acquire(self._name(team_id, "lock"), False, deadline, why))
                finally:
                    gate()
        except BaseException:
            _release_all(held)
            raise
        return lambda: _release_all(held)

    @asynccontextmanager
    async def writing(self, team_ids: Iterable[str]) -> AsyncIterator[None]:
        """An async writer's hold on its teams (the waiting happens off the event loop)."""
        release = await asyncio.to_thread(self.acquire_shared, list(team_ids))
        try:
            yield
        finally:
            await asyncio.to_thread(release)

    @contextmanager
    def switching(self, team_id: str, wait_s: float) -> Iterator[None]:
        """Hold ``team_id`` exclusively: new writers wait at the gate, then the writes in
        flight are waited for (at most ``wait_s`` each step, else ``BackendUnavailable``)."""
        why = f"writes of team {team_id!r} did not pause within {wait_s:g}s"
        gate = self._acquire(self._name(team_id, "gate"), True, time.monotonic() + wait_s, why)
        try:
            lock = self._acquire(self._name(team_id, "lock"), True, time.monotonic() + wait_s, why)
            try:
                yield
            finally:
                lock()
        finally:
            gate()


def _release_all(held: list[Callable[[], None]]) -> None:
    for release in reversed(held):
        release()


def write_barrier(sources: Any, wait_s: float = 30.0) -> WriteBarrier | None:
    """The barrier of ``sources``'s state database (``None`` without a registry)."""
    engine = getattr(sources, "engine", None)
    return WriteBarrier(engine, wait_s=wait_s) if engine is not None else None
