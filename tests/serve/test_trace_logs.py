"""Serve's JSON replica log carries our trace ids: a small app (the gateway's FastAPI app over
fakes, plus a route that logs) deployed on the suite's cluster with ``logging_config``
``encoding: JSON`` into a folder of the test's own."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.serve

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def traced_app() -> Any:
    """The deployment, built here so that Ray pickles the class by value (the replica cannot
    import the tests package)."""
    from ray import serve

    class TracedIngress:
        def __serve_build_asgi_app__(self) -> Any:
            import logging

            from serve_app.asgi import create_app
            from serve_app.testing import build_gateway

            app = create_app(build_gateway().services)

            @app.get("/_probe")
            def probe() -> dict[str, bool]:
                logging.getLogger("serve_app.probe").info("probe inside the request")
                return {"ok": True}

            return app

    ingress = serve.ingress()(TracedIngress)
    return serve.deployment(ingress, name="TracedIngress", ray_actor_options={"num_cpus": 0})


def json_records(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in folder.glob("replica_*TracedIngress*.log"):
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def test_the_json_replica_log_has_our_records_and_the_access_line_with_the_trace_id(
    gateway: str, tmp_path: Path
):
    from ray import serve

    logs = tmp_path / "serve-logs"
    serve.run(
        traced_app().bind(),
        name="rag_traced",
        route_prefix="/traced",
        logging_config={"encoding": "JSON", "log_level": "INFO", "logs_dir": str(logs)},
    )
    try:
        resp = httpx.get(
            f"{gateway}/traced/_probe",
            headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-trace-id"] == TRACE
        assert resp.headers["traceparent"].startswith(f"00-{TRACE}-")
        refused = httpx.post(
            f"{gateway}/traced/rag/search_docs", json={}, headers={"x-trace-id": "job-42"}
        )
        assert refused.status_code == 401 and refused.headers["x-trace-id"] == "job-42"
        # The MCP endpoint's access line names its route, not the app's root (issue 38).
        mcp = httpx.post(
            f"{gateway}/traced/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"x-trace-id": "mcp-7", "accept": "application/json, text/event-stream"},
        )
        assert mcp.headers["x-trace-id"] == "mcp-7", mcp.text
        deadline = time.monotonic() + 20
        while True:
            records = json_records(logs)
            access = [r for r in records if r.get("message", "").startswith(("GET", "POST"))]
            if len(access) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        (probe,) = [r for r in records if r.get("message") == "probe inside the request"]
        assert probe["trace_id"] == TRACE
        assert probe["request_id"] == resp.headers["x-request-id"]  # joined to Serve's own id
        assert probe["route"] == "/traced/_probe" and probe["application"] == "rag_traced"
        by_route = {a["route"]: a for a in access}
        assert by_route["/traced/_probe"]["trace_id"] == TRACE
        assert by_route["/traced/rag/search_docs"]["trace_id"] == "job-42"
        assert by_route["/traced/mcp"]["trace_id"] == "mcp-7", sorted(by_route)
    finally:
        serve.delete("rag_traced")
