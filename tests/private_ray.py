"""A private local Ray for a test (Ray Data jobs, a deployment tried alone): 2 CPUs (the
shipped node's size), its files in a temp folder, loopback addresses, token auth on (the
caller has set ``RAY_AUTH_TOKEN_PATH``: a driver keeps the first token it read)."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path


def init_private_ray(prefix: str) -> Path:
    """``ray.init`` a fresh local cluster; returns its temp folder.

    A start whose raylet does not register in time is tried once more in a fresh folder:
    on this 2-vCPU VM that happened to 2 of 4 back-to-back integration runs (the session's
    dashboard process aborting, or the raylet not registering within Ray's 30 s), never to
    the cluster once up."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    try:
        return _start(prefix)
    except Exception as exc:
        if "timed out during startup" not in str(exc):
            raise
        warnings.warn(f"the local Ray did not start ({exc}); trying once more", stacklevel=2)
        ray.shutdown()
    return _start(prefix)


def _start(prefix: str) -> Path:
    import ray

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    ray.init(
        address="local",
        include_dashboard=False,
        _temp_dir=str(tmp / "ray"),
        log_to_driver=False,
        num_cpus=2,
    )
    return tmp
