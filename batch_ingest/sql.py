"""SQLAlchemy URLs of the gateway's own state databases (source documents, reindex jobs, the
audit log): one rule for where a relative SQLite file lives."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url

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
