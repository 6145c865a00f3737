"""The process environment of a ``bench.serve_harness.ServeHarness`` (``HarnessEnv``): a
private temp folder with a fresh random Ray auth token (so nothing is written to
``~/.ray``), the Ray variables that keep the cluster on loopback with token auth, offline
Hugging Face, and the shipped Ray Serve environment of ``deployments.serve_env`` (HAProxy
side ports of its own) where the caller set none; every variable it set is restored at the
harness's stop.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger("bench.harness")


class HarnessEnv:
    """Variables set in ``os.environ`` for a harness, with their earlier values to restore."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def set(self, name: str, value: str) -> None:
        self._saved.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def restore(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()

    def prepare(self) -> Path:
        """A private temp folder with a random auth token, and the Ray environment.

        Returns:
            The temp folder (Ray's ``_temp_dir``; the caller removes it).
        """
        temp_dir = Path(tempfile.mkdtemp(prefix="bench_ray_", dir="/tmp"))
        token_path = temp_dir / "auth_token"
        token_path.write_text(secrets.token_hex(32))
        token_path.chmod(0o600)
        self.set("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        self.set("RAY_AUTH_MODE", "token")
        self.set("RAY_AUTH_TOKEN_PATH", str(token_path))
        self.set("HF_HUB_OFFLINE", "1")
        self.set("TRANSFORMERS_OFFLINE", "1")
        # The shipped Ray Serve environment (HAProxy ingress), unless the caller set its own,
        # with HAProxy's side ports of its own (a gateway may run beside the benchmark).
        from deployments import serve_env

        for name, value in serve_env.apply({**os.environ}, own_ports=True).items():
            if name not in os.environ:
                self.set(name, value)
        if "ray._raylet" in sys.modules:
            # ray was imported before this harness: refresh its cached config the way
            # ray._private.authentication.authentication_token_setup does.
            logger.warning("ray was imported before ServeHarness; refreshing its auth config")
            from ray._raylet import (  # type: ignore[attr-defined]
                AuthenticationTokenLoader,
                Config,
            )

            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()
        return temp_dir
