"""The Ray a reindex driver connects to: the cluster ``RAY_ADDRESS`` names, else a private
local instance whose files stay in the repository's ``var/ray/`` (``RAG_VAR_DIR``), not in
``/tmp/ray`` and ``~/.ray``.

Ray 2.60 turns token authentication on for a new local instance (``RAY_AUTH_MODE`` unset)
and, finding no token, writes one to ``~/.ray/auth_token``; here the token is
``var/ray/auth_token`` (made once, mode 600) through ``RAY_AUTH_TOKEN_PATH``, which Ray finds
first, and the session files go to ``var/ray/tmp`` (``_temp_dir``). A ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH`` already in the environment is kept. ``RAY_AUTH_MODE`` is left to Ray:
the driver reads it when ``ray`` is imported, so setting it here would reach the GCS but not
the driver (which then sends no token).
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger("batch_ingest.reindex")

ROOT = Path(__file__).resolve().parents[2]
# A Unix socket path holds at most 107 bytes; Ray's session directory and socket name add
# about 65 to the temp dir ("/session_<date>_<time>_<us>_<pid>/sockets/plasma_store").
MAX_TEMP_DIR_BYTES = 40


def ray_dir() -> Path:
    """``$RAG_VAR_DIR/ray`` (default: ``<repository>/var/ray``)."""
    return Path(os.environ.get("RAG_VAR_DIR") or ROOT / "var") / "ray"


def temp_dir(base: Path) -> Path:
    """Ray's session directory root: ``<base>/tmp``, or, where that path is too long for
    Ray's socket names, a short private one in the system temp directory."""
    wanted = base / "tmp"
    if len(str(wanted).encode()) <= MAX_TEMP_DIR_BYTES:
        return wanted
    short = Path(tempfile.gettempdir()) / f"rag-ray-{os.getuid()}"
    logger.info("reindex: %s is too long for Ray's socket paths; using %s", wanted, short)
    return short


def use_private_token(base: Path) -> Path | None:
    """Point ``RAY_AUTH_TOKEN_PATH`` (where unset) at ``<base>/auth_token`` and make that
    file once; returns the token file (``None`` when ``RAY_AUTH_TOKEN`` holds the token)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    token = Path(os.environ.setdefault("RAY_AUTH_TOKEN_PATH", str(base / "auth_token")))
    if not (token.exists() and token.stat().st_size):
        token.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    return token


def init_ray(**kwargs: Any) -> None:
    """Connect this driver to Ray: the cluster of ``RAY_ADDRESS``, else a private local
    instance with its files under ``ray_dir()``. ``kwargs`` go to ``ray.init`` (e.g.
    ``num_cpus`` for the local one)."""
    import ray

    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, **kwargs}
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **options)
        return
    base = ray_dir()
    use_private_token(base)
    tmp = temp_dir(base)
    tmp.mkdir(parents=True, exist_ok=True)
    ray.init(address="local", _temp_dir=str(tmp), **options)
