"""The Ray Serve environment of every gateway cluster (deployments/serve_env.py): one list,
applied by every place that starts a cluster, a value set by the operator kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from deployments import serve_env

ROOT = Path(__file__).resolve().parents[3]


def test_apply_sets_what_is_missing_and_keeps_what_the_operator_set():
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "0", "OTHER": "x"}
    assert serve_env.apply(env) == {**serve_env.SERVE_ENV, "RAY_SERVE_ENABLE_HA_PROXY": "0"}
    assert env["OTHER"] == "x"
    fresh: dict[str, str] = {}
    assert serve_env.apply(fresh) == serve_env.SERVE_ENV
    assert fresh["RAY_SERVE_ENABLE_HA_PROXY"] == "1"


def test_a_cluster_beside_another_gets_haproxy_side_ports_of_its_own():
    env = {"RAY_SERVE_HAPROXY_STATS_PORT": "18404"}
    values = serve_env.apply(env, own_ports=True)
    assert values["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404"  # the operator's kept
    metrics = int(values["RAY_SERVE_HAPROXY_METRICS_PORT"])
    assert metrics not in (9101, 18404) and 1024 < metrics < 65536


def test_the_module_prints_export_lines_for_a_shell():
    out = subprocess.run(
        [sys.executable, "-m", "deployments.serve_env"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    ).stdout
    assert out.splitlines() == [f"export {k}={v}" for k, v in serve_env.SERVE_ENV.items()]


def test_every_place_that_starts_a_cluster_applies_it():
    eval_line = "-m deployments.serve_env)"
    assert eval_line in (ROOT / "scripts/ray_local.sh").read_text()
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        (start,) = [c for c in cluster[key] if "ray start" in c]
        assert eval_line in start and start.index(eval_line) < start.index("ray start"), key
    manifest = yaml.safe_load((ROOT / "deploy/k8s/rayservice.yaml").read_text())
    cluster_spec = manifest["spec"]["rayClusterConfig"]
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert {k: env.get(k) for k in serve_env.SERVE_ENV} == serve_env.SERVE_ENV
    # The benchmark harness and the Serve suite start their clusters with it too.
    for path in ("bench/harness_env.py", "tests/serve/conftest.py"):
        assert "serve_env.apply(" in (ROOT / path).read_text(), path
