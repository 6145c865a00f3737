"""The bulk loader always finishes (issue 36): a gateway that answers 408, 429 and 503 at
random, drops connections, fails documents inside a 200 and sends large batches to a job
still ends with every document stored exactly once; what cannot pass is reported by line."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import httpx
import pytest

from batch_ingest import load_jsonl
from batch_ingest.loader import Line, Loader, make_batches, retry_after_s

TEAM = "dao_loader"


class FlakyGateway:
    """``POST /ingest/documents`` over a dict; refuses, drops and fails at random."""

    def __init__(self, seed: int, *, refuse: float = 0.3, fail_doc: float = 0.1) -> None:
        self.rng = random.Random(seed)
        self.refuse, self.fail_doc = refuse, fail_doc
        self.stored: dict[str, str] = {}
        self.writes: dict[str, int] = {}
        self.jobs: dict[str, dict] = {}
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            roll = self.rng.random()
            if request.method == "GET":
                return httpx.Response(200, json=self.jobs[request.url.path.rsplit("/", 1)[1]])
            if roll < self.refuse / 3:
                raise httpx.ConnectError("connection reset by peer", request=request)
            if roll < self.refuse * 2 / 3:
                return httpx.Response(503, headers={"retry-after": "0"}, json={"error": "busy"})
            if roll < self.refuse:
                status = self.rng.choice([408, 429, 502])
                return httpx.Response(status, json={"error": "try again"})
            docs = json.loads(request.content)["documents"]
            results = []
            for d in docs:
                if self.rng.random() < self.fail_doc:
                    results.append({"doc_id": d["doc_id"], "status": "failed", "error": "graph"})
                    continue
                new = self.stored.get(d["doc_id"]) != d["text"]
                self.stored[d["doc_id"]] = d["text"]
                self.writes[d["doc_id"]] = self.writes.get(d["doc_id"], 0) + new
                results.append(
                    {
                        "doc_id": d["doc_id"],
                        "status": "indexed" if new else "unchanged",
                        "chunks": 1,
                    }
                )
            body = {
                "indexed": sum(r["status"] == "indexed" for r in results),
                "unchanged": sum(r["status"] == "unchanged" for r in results),
                "failed": sum(r["status"] == "failed" for r in results),
                "documents": results,
                "degraded": False,
                "degraded_reasons": [],
            }
            if request.headers.get("prefer") == "respond-async":
                job_id = f"job{len(self.jobs)}"
                self.jobs[job_id] = {"job_id": job_id, "status": "done", "result": body}
                return httpx.Response(202, json={"status_url": f"/ingest/jobs/{job_id}"})
            return httpx.Response(200, json=body)


def corpus(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "docs.jsonl"
    rng = random.Random(7)
    with path.open("w") as f:
        for i in range(n):
            words = " ".join(f"word{rng.randrange(500)}" for _ in range(rng.randrange(5, 400)))
            f.write(json.dumps({"team_id": TEAM, "doc_id": f"d{i:04d}", "text": words}) + "\n")
    return path


def run(path: Path, gateway: FlakyGateway, *more: str) -> int:
    client = httpx.Client(base_url="http://gateway", transport=httpx.MockTransport(gateway))
    args = [str(path), "--no-progress", "--batch-chars", "6000", "--async-chars", "4000"]
    return load_jsonl.main([*args, *more], client=client)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_flaky_gateway_still_gets_every_document_once(tmp_path, seed, monkeypatch, capsys):
    monkeypatch.setattr("batch_ingest.loader.random.uniform", lambda a, b: 0.0)  # no real waits
    path = corpus(tmp_path, 400)
    gateway = FlakyGateway(seed)
    assert run(path, gateway, "--workers", "4", "--max-attempts", "30") == 0, capsys.readouterr()
    assert len(gateway.stored) == 400 and set(gateway.writes.values()) == {1}
    out = capsys.readouterr().out
    assert "400 documents" in out and "failed 0" in out and "retries" in out


def test_what_cannot_pass_is_named_by_line_and_resume_sends_the_rest(tmp_path, capsys):
    path = corpus(tmp_path, 50)

    class Refusing(FlakyGateway):
        def __call__(self, request):
            body = json.loads(request.content) if request.method == "POST" else {}
            if any(d["doc_id"] == "d0013" for d in body.get("documents", [])):
                return httpx.Response(422, json={"error": "invalid_input"})
            return super().__call__(request)

    gateway = Refusing(1, refuse=0.0, fail_doc=0.0)
    assert run(path, gateway, "--batch", "5") == 1
    out = capsys.readouterr().out
    assert "not loaded: line 14 (d0013): HTTP 422" in out
    assert len(gateway.stored) == 45  # its batch of 5, nothing else
    fixed = FlakyGateway(2, refuse=0.0, fail_doc=0.0)
    assert run(path, fixed, "--batch", "5", "--resume") == 0
    # Only what was left: the refused batch, with the document that was refused.
    assert len(fixed.stored) == 5 and "d0013" in fixed.stored
    assert not set(fixed.stored) & set(gateway.stored)
    assert "already loaded 45" in capsys.readouterr().out


def test_batches_are_cut_by_characters():
    lines = [
        Line(i, {"doc_id": str(i), "text": "x" * size})
        for i, size in enumerate([10, 50, 45, 5, 200])
    ]
    batches = make_batches(lines, batch_chars=100, batch_docs=10)
    assert [[x.number for x in b] for b in batches] == [[0, 1], [2, 3], [4]]
    assert [len(b) for b in make_batches(lines, batch_chars=10_000, batch_docs=2)] == [2, 2, 1]


def test_retry_after_is_honoured_in_seconds_and_as_a_date():
    assert retry_after_s(httpx.Response(429, headers={"retry-after": "7"})) == 7.0
    dated = httpx.Response(503, headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert retry_after_s(dated) == 0.0  # in the past
    assert retry_after_s(httpx.Response(503)) is None
    waits: list[float] = []
    calls = iter([httpx.Response(429, headers={"retry-after": "3"}), None])

    def handler(request):
        answer = next(calls)
        if answer is not None:
            return answer
        return httpx.Response(200, json={"documents": [{"doc_id": "a", "status": "indexed"}]})

    client = httpx.Client(base_url="http://g", transport=httpx.MockTransport(handler))
    out = Loader(client, sleep=waits.append).send([Line(1, {"doc_id": "a", "text": "t"})])
    assert out.indexed == 1 and waits == [3.0]
