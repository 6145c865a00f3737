"""SQLAlchemy URLs of the gateway's own state databases (source documents, reindex jobs, the
audit log): one rule for where a relative SQLite file lives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError

# The repository root: relative SQLite paths are relative to it, wherever the process starts.
ROOT = Path(__file__).resolve().parent.parent


def resolve_url(url: str) -> str:
    """A relative SQLite path is relative to the repository root; its folder is created."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database)
        if not path.is_absolute():
            path = ROOT / path
        path.parent.mkdir(parents=True, exist_ok=True)
        parsed = parsed.set(database=str(path))
    return parsed.render_as_string(hide_password=False)


def increment(
    engine: Engine,
    table: sa.Table,
    key: dict[str, Any],
    add: dict[str, int],
    values: dict[str, Any],
) -> None:
    """Add ``add`` to the counters of the row ``key`` (and set ``values``), creating the row
    with ``add`` as its counters when there is none. Safe against a concurrent writer of the
    same new row (another process's INSERT first: this one updates instead); one statement
    per attempt, the same in SQLite and PostgreSQL."""
    where = [table.c[name] == value for name, value in key.items()]
    for _ in range(3):
        with engine.begin() as conn:
            counters = {name: table.c[name] + n for name, n in add.items()}
            if conn.execute(sa.update(table).where(*where).values(**counters, **values)).rowcount:
                return
        try:
            with engine.begin() as conn:
                conn.execute(sa.insert(table).values(**key, **add, **values))
            return
        except IntegrityError:
            continue
