"""One real local Ray cluster and the whole Serve app per session, driven over HTTP.

Run this suite in its own pytest process (scripts/test.sh does): Ray's @serve.batch queue is
per process and bound to the first event loop, and the cluster is a session-wide singleton.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from deployments import serve_env
from deployments.testing.tiny_models import build_tiny_cross_encoder
from deployments.vector_store.store import MilvusStore
from serve_app.testing import PEPPER, write_api_keys
from tests.conftest import require_services

pytestmark = pytest.mark.serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    body = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(base + "/readyz", timeout=10)
            body = r.json()
            if r.status_code == 200:
                return
        except httpx.HTTPError as exc:
            body = str(exc)
        time.sleep(1)
    pytest.fail(f"gateway at {base} not ready after {timeout:.0f} s: {body}")


# The team of the suite's one API key, and the key (set when the gateway starts).
KEY_TEAM = "dao_serve_keyed"
API_KEY: dict[str, str] = {}
# How the second app (reranker on, graph off) was deployed, for a test that redeploys it.
RR_APP: dict[str, object] = {}


@pytest.fixture(scope="session")
def api_key(gateway: str) -> str:
    """An API key of ``KEY_TEAM`` (member) that the suite's main app verifies."""
    return API_KEY["key"]


@pytest.fixture(scope="session")
def gateway(run_id: str):
    """Base URL of the running gateway; tears everything down at the end."""
    settings = require_services()
    tmp = Path(tempfile.mkdtemp(prefix="rag-serve-test-"))
    token = tmp / "ray_token"
    token.write_text(secrets.token_hex(32))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    # The Ray Serve environment scripts/ray_local.sh starts users' clusters with (HAProxy's
    # side ports free ones: a gateway started by start.sh may run beside the suite).
    serve_env.apply(own_ports=True)
    import ray
    from ray import serve

    from serve_app.app import AppArgs, build_app

    collection = f"serve_{run_id}"
    port = free_port()
    # Logical CPUs: as many as scripts/start.sh gives Ray (scripts/ray_local.sh), so a
    # reindex job submitted through /admin/reindex runs beside the Serve replicas as it does
    # for users (its embedding actor takes reindex.num_cpus_per_actor of the 0.7 left). The
    # second app (reranker on) asks for no CPU of its own: it is a test fixture, not part
    # of what users run.
    # The node's metrics agent exports the replicas' metrics on a port of its own
    # (tests/serve/test_metrics.py scrapes it; ray.nodes() names it).
    ray.init(
        address="local",
        include_dashboard=False,
        _temp_dir=str(tmp / "ray"),
        log_to_driver=False,
        num_cpus=int(os.environ.get("RAG_RAY_CPUS", "2")),
        _metrics_export_port=free_port(),
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # Dev mode trusts a request without a credential, but an API key sent is verified: one
    # key of one team, for the tests of tenancy from the credential (tests/serve/test_mcp_*).
    (API_KEY["key"],) = write_api_keys(
        tmp / "api_keys.yaml", [{"sub": "svc_serve", "teams": {KEY_TEAM: ["member"]}}]
    )
    auth = {"api_keys_file": str(tmp / "api_keys.yaml"), "api_key_pepper": PEPPER}
    # A short body-read timeout for tests/serve/test_ingest_limits_serve.py's stalled body.
    # The fuzz run sends ~50 requests/s with the one key: over the default rate limit, which
    # tests/unit/serve_app/http/test_rate_limits.py covers.
    main = {
        "milvus": {"collection": collection},
        "auth": auth,
        "http": {"body_read_timeout_s": 5},
        "rate_limit": {"per_credential_per_s": 10_000, "per_credential_burst": 10_000},
    }
    app = build_app(AppArgs(settings=main))
    serve.run(app, name="rag", route_prefix="/")
    # The same store behind a second app whose Reranker deployment loads a real (tiny)
    # cross-encoder checkpoint; graph off to keep it small.
    reranker_path = build_tiny_cross_encoder(tmp / "tiny-cross-encoder")
    rr_settings = {
        "milvus": {"collection": collection},
        "embedder": {"num_cpus": 0},
        "reranker": {"enabled": True, "model_path": str(reranker_path), "num_cpus": 0},
    }
    RR_APP.update(settings=rr_settings, name="rag_rr", route_prefix="/rr")
    serve.run(
        build_app(AppArgs(settings=rr_settings, graph_enabled=False)),
        name="rag_rr",
        route_prefix="/rr",
    )
    base = f"http://127.0.0.1:{port}"
    for prefix in ("", "/rr"):
        wait_ready(base + prefix)
    yield base
    serve.shutdown()
    ray.shutdown()
    store = MilvusStore(settings.milvus.model_copy(update={"collection": collection}), dim=384)
    store.drop()
    store.close()


@pytest.fixture(scope="session")
def client(gateway: str):
    with httpx.Client(base_url=gateway, timeout=120) as client:
        yield client
