"""Through Serve's proxy: a document longer than one request can index is accepted as a
background job (202) and indexed exactly once; a body that stalls gets the gateway's 408
long before the proxy's own request timeout."""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlparse

import httpx
import pytest

pytestmark = pytest.mark.serve

WORDS = [
    "solar",
    "battery",
    "grid",
    "inverter",
    "district",
    "cooperative",
    "meter",
    "tariff",
    "storage",
    "feeder",
    "transformer",
    "substation",
    "outage",
    "forecast",
    "demand",
    "panel",
    "rooftop",
    "microgrid",
]


def long_text(chars: int) -> str:
    """Varied English-like paragraphs (no two chunks alike) of about ``chars`` characters."""
    parts, n, i = [], 0, 0
    while n < chars:
        words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(12)]
        sentence = f"Report {i}: the {' '.join(words)} figures for site {i * 13 % 997}."
        parts.append(sentence + ("\n\n" if i % 6 == 5 else " "))
        n += len(parts[-1])
        i += 1
    return "".join(parts)


def test_a_long_document_is_indexed_by_a_background_job(client: httpx.Client):
    team = f"dao_jobs_{uuid.uuid4().hex[:6]}"
    text = long_text(210_000)  # over ingest.sync_max_chars (200,000)
    doc = {"team_id": team, "doc_id": "annual", "title": "Annual grid report", "text": text}
    r = client.post("/ingest/documents", json={"documents": [doc]})
    assert r.status_code == 202, r.text
    url = r.json()["status_url"]
    deadline = time.monotonic() + 240
    while True:
        status = client.get(url).json()
        if status["status"] in ("done", "failed") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert status["status"] == "done", status
    result = status["result"]
    assert result["indexed"] == 1 and not result["degraded"], result
    chunks = result["documents"][0]["chunks"]
    assert chunks > 100
    # Exactly once: sending the same document again (synchronously this time) is unchanged.
    again = client.post(
        "/ingest/documents", json={"documents": [doc]}, headers={"prefer": "respond-async"}
    )
    assert again.status_code == 202
    redo = client.get(again.json()["status_url"]).json()
    for _ in range(120):
        if redo["status"] in ("done", "failed"):
            break
        time.sleep(1)
        redo = client.get(again.json()["status_url"]).json()
    assert redo["result"]["unchanged"] == 1, redo
    found = client.post(
        "/rag/search_docs", json={"team_id": team, "query": "Report 1234 site figures", "top_k": 3}
    ).json()
    assert found["matches"] and found["matches"][0]["source_ref"]["id"] == "annual"


def test_a_stalled_body_gets_408_from_the_gateway(gateway: str):
    url = urlparse(gateway)
    body = json.dumps({"team_id": "dao_x", "query": "grid", "top_k": 3}).encode()
    head = (
        f"POST /rag/search_docs HTTP/1.1\r\nHost: {url.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(head + body[:8])  # ... and nothing more
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            part = sock.recv(65536)
            if not part:
                break
            answer += part
    took = time.monotonic() - started
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 408 " in status_line, answer[:300]
    payload = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert payload["error"] == "request_timeout"
    assert took < 20  # the suite's http.body_read_timeout_s is 5 s; the proxy's timeout 120 s
