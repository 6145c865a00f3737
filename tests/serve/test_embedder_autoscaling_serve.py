"""The Embedder scales on queued texts under Serve (issue 36; docs/operations.md "Scaling the
Embedder on queued texts"): deployed alone with the queued-texts policy, 1 to 2 replicas and
100 texts per replica, a burst of 800 passages in 8 requests takes it to 2 replicas (Serve's
default policy would see 8 requests, under one replica's target of 100), and once they are
embedded it goes back to 1.

The scenario runs in a child process with a private Ray of its own (2 CPUs, the replicas ask
for none): this suite's session Ray (tests/serve/conftest.py) may or may not be up in this
process, and a driver keeps the first Ray token it read. Needs no backend service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[2]
APP = "embedder_autoscaling"
TEXTS, REQUESTS, PER_REPLICA = 800, 8, 100


def _replicas(serve: Any) -> tuple[int, int]:
    """(running, all but stopping) replicas of the Embedder."""
    status = serve.status().applications.get(APP)
    if status is None or "Embedder" not in status.deployments:
        return 0, 0
    replica_states = status.deployments["Embedder"].replica_states
    states = {str(getattr(k, "value", k)): v for k, v in replica_states.items()}
    return states.get("RUNNING", 0), sum(v for k, v in states.items() if k != "STOPPING")


def scenario() -> dict[str, Any]:
    """Runs in the child: deploy, burst, watch the replica count; returns what it saw."""
    import secrets
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="rag-autoscale-"))
    token = tmp / "ray_token"
    token.write_text(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    import ray
    from ray import serve

    from deployments.config import EmbedderSettings
    from deployments.models.autoscale import POLICY
    from deployments.models.embedder import EmbedderDeployment, deployment_options
    from tests.private_ray import init_private_ray

    ray_dir = init_private_ray("rag-autoscale-ray-")
    seen: list[tuple[float, int, int]] = []
    start = time.monotonic()

    def watch() -> tuple[int, int]:
        running, total = _replicas(serve)
        seen.append((round(time.monotonic() - start, 1), running, total))
        return running, total

    try:
        # Handles only: no HTTP port of its own that a gateway on this host (8000) could hold.
        serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
        # The packaged MiniLM on torch, one thread (the backend pinned: the test is about scaling).
        settings = EmbedderSettings(backend="transformers", num_cpus=0)
        options = {
            **deployment_options(settings),
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": 2,
                "target_ongoing_requests": PER_REPLICA,  # texts per replica under the policy
                "look_back_period_s": 2,
                "metrics_interval_s": 0.5,
                "upscale_delay_s": 0,
                "downscale_delay_s": 5,
                "policy": {"policy_function": POLICY},
            },
        }
        app = serve.deployment(EmbedderDeployment).options(**options).bind(settings)
        handle = serve.run(app, name=APP, route_prefix=None)
        deadline = time.monotonic() + 180
        while not handle.status.remote().result()["ready"]:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.5)
        watch()
        words = " ".join(f"word{i} the vectors of the gateway are kept in milvus" for i in range(8))
        texts = [f"{words} {i}" for i in range(TEXTS)]
        step = TEXTS // REQUESTS
        calls = [
            handle.encode.remote(texts[i : i + step], "passage") for i in range(0, TEXTS, step)
        ]
        deadline = time.monotonic() + 240
        while watch()[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        scaled_up = seen[-1][1]
        embedded = sum(len(call.result(timeout_s=300).dense) for call in calls)
        backlog = handle.record_autoscaling_stats.remote().result()
        deadline = time.monotonic() + 120
        while watch()[1] > 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        return {
            "scaled_up": scaled_up,
            "scaled_down": seen[-1][1:],
            "embedded": embedded,
            "backlog_after": backlog,
            "seen": seen,
        }
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_the_embedder_scales_out_on_queued_texts_and_back():
    code = (
        "import json; from tests.serve.test_embedder_autoscaling_serve import scenario; "
        "print('RESULT ' + json.dumps(scenario()))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["embedded"] == TEXTS
    assert result["scaled_up"] == 2, result["seen"]
    assert result["backlog_after"]["queued_texts"] == 0
    assert result["scaled_down"] == [1, 1], result["seen"]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
