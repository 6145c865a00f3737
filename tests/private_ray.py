"""A private local Ray for a test (Ray Data jobs, a deployment tried alone): 2 CPUs (the
shipped node's size), its files in a temp folder, loopback addresses, token auth on (the
caller has set ``RAY_AUTH_TOKEN_PATH``: a driver keeps the first token it read)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def init_private_ray(prefix: str) -> Path:
    """``ray.init`` a fresh local cluster; returns its temp folder."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    ray.init(
        address="local",
        include_dashboard=False,
        _temp_dir=str(tmp / "ray"),
        log_to_driver=False,
        num_cpus=2,
    )
    return tmp
