"""A request body that stalls gets 408, a body over the size limit 413, both in the gateway's
JSON error shape, without waiting for the rest of the body."""

from __future__ import annotations

import asyncio
import json
import time

from serve_app.testing import build_gateway

BODY = json.dumps({"team_id": "dao_a", "query": "grid operator", "top_k": 3}).encode()


def call(app, headers, parts, *, stall: bool):
    """Run one POST /rag/search_docs through the ASGI app, the body sent in ``parts``; with
    ``stall`` the client then sends nothing more (and never disconnects)."""
    sent: list[dict] = []

    async def run():
        queue = list(parts)

        async def receive():
            if queue:
                chunk = queue.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(queue) or stall}
            await asyncio.sleep(3600)  # a client that never sends the rest

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/rag/search_docs",
            "raw_path": b"/rag/search_docs",
            "query_string": b"",
            "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000),
        }
        await asyncio.wait_for(app(scope, receive, send), timeout=10)

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


def test_a_stalled_body_gets_408_within_the_timeout():
    gw = build_gateway(auth={"mode": "dev"}, http={"body_read_timeout_s": 0.3})
    app = gw.client.app
    headers = {"content-type": "application/json", "content-length": str(len(BODY))}
    started = time.perf_counter()
    status, body = call(app, headers, [BODY[:10]], stall=True)
    took = time.perf_counter() - started
    assert status == 408, body
    assert body["error"] == "request_timeout" and "within 0.3 s" in body["message"]
    assert "10 of" in body["message"] and body["trace_id"]
    assert took < 2


def test_a_body_sent_in_parts_in_time_is_served():
    gw = build_gateway(auth={"mode": "dev"}, http={"body_read_timeout_s": 5})
    headers = {"content-type": "application/json", "content-length": str(len(BODY))}
    status, body = call(gw.client.app, headers, [BODY[:10], BODY[10:]], stall=False)
    assert status == 200, body


def test_a_body_over_the_limit_gets_413_by_its_declared_length():
    gw = build_gateway(auth={"mode": "dev"}, http={"max_body_bytes": 1024})
    headers = {"content-type": "application/json", "content-length": str(10_000)}
    status, body = call(gw.client.app, headers, [b"{"], stall=True)
    assert status == 413 and body["error"] == "payload_too_large"
    assert "10000 bytes" in body["message"]


def test_a_chunked_body_over_the_limit_gets_413_as_it_streams():
    gw = build_gateway(auth={"mode": "dev"}, http={"max_body_bytes": 1024})
    headers = {"content-type": "application/json", "transfer-encoding": "chunked"}
    status, body = call(gw.client.app, headers, [b" " * 800, b" " * 800], stall=True)
    assert status == 413 and body["error"] == "payload_too_large"


def test_a_url_over_the_limit_is_414_in_the_error_shape_and_at_the_limit_is_served():
    gw = build_gateway(auth={"mode": "dev"}, http={"max_url_bytes": 1024})
    base = "/healthz?q="
    at_limit = gw.client.get(base + "a" * (1024 - len(base)))
    assert at_limit.status_code == 200, at_limit.text
    over = gw.client.get(base + "a" * (1025 - len(base)))
    assert over.status_code == 414, over.text
    body = over.json()
    assert body["error"] == "uri_too_long" and body["trace_id"], body
    assert "1025 bytes" in body["message"] and "1024" in body["message"], body
    assert over.headers["content-type"] == "application/json"
    assert over.headers["x-trace-id"] == body["trace_id"]


def test_the_default_url_limit_answers_a_long_query_string_on_any_route_with_414():
    gw = build_gateway()  # JWT on: the URL is refused before authentication
    for path in ("/audit/decisions", "/rag/search_docs", "/no/such/route"):
        r = gw.client.get(f"{path}?subject={'x' * 9000}")
        assert r.status_code == 414, (path, r.text[:200])
        assert r.json()["error"] == "uri_too_long"
    assert gw.client.get(f"/healthz?q={'x' * 8000}").status_code == 200
