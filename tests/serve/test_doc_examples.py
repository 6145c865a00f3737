"""Every request example of the README and docs/ runs against the Serve app with the sample
corpus loaded (batch_ingest/sample_corpus/sample.jsonl, what ``scripts/start.sh`` loads) and
answers what the text says (issue 38, item 8).

An example is a ``curl`` command to ``http://127.0.0.1:8000`` in a ``bash`` block, or an
inline `` `POST /route {json}` ``. Where a ``json`` block follows a curl example, the answer
must contain it: the same keys and values, lists compared from their start (an example may
show fewer items than come back), except what differs per run or per machine — scores,
timings, trace and chunk ids, and any value or key written with an ellipsis (…). Where a
``text`` block follows (``"format": "text"``), the answer is that text, scores aside and
without the semantic cache's first line (``(served from cache, N s old)``). The suite's
app runs in development mode, where a request without a credential is trusted, so a
``$TOKEN`` placeholder is left out; the ``X-Team-Id`` header stays. Operators' examples
(``/admin/…``) start jobs and are left to tests/serve/test_redeploy.py and the reindex tests.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from batch_ingest.load_jsonl import SAMPLE

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BASE = "http://127.0.0.1:8000"
# Values that differ per run or machine: never compared.
VOLATILE = {"score", "took_ms", "trace_id", "chunk_id", "similarity", "age_s", "scores"}
ELLIPSIS = "…"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`(POST|GET) (/[^\s`]*) (\{[^`]*\})`")


@dataclass
class Example:
    where: str
    method: str
    path: str
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    expected: Any = None

    def __str__(self) -> str:
        return f"{self.where} {self.method} {self.path}"


def parse_curl(command: str) -> tuple[str, str, dict[str, str], Any]:
    args = shlex.split(command.replace("\\\n", " "))
    url, headers, data, method = "", {}, None, ""
    it = iter(args[1:])
    for arg in it:
        if arg in ("-H", "--header"):
            name, _, value = next(it).partition(":")
            headers[name.strip().lower()] = value.strip()
        elif arg in ("-d", "--data", "--data-raw"):
            data = json.loads(next(it))
        elif arg in ("-X", "--request"):
            method = next(it)
        elif arg.startswith("http"):
            url = arg
    if "$TOKEN" in headers.get("authorization", ""):
        del headers["authorization"]
    return method or ("POST" if data is not None else "GET"), url[len(BASE) :], headers, data


def collect() -> list[Example]:
    found: list[Example] = []
    for file in FILES:
        text = file.read_text(encoding="utf-8")
        name = file.relative_to(ROOT).as_posix()
        blocks = list(FENCE.finditer(text))
        for i, block in enumerate(blocks):
            lang, body = block.group(1), block.group(2)
            if lang != "bash" or f"curl -s {BASE}/" not in body:
                continue
            for command in re.split(r"\n(?=curl )", body.strip()):
                method, path, headers, data = parse_curl(command)
                if path.startswith("/admin/"):
                    continue
                line = text[: block.start()].count("\n") + 1
                ex = Example(f"{name}:{line}", method, path, data, headers)
                after = blocks[i + 1] if i + 1 < len(blocks) else None
                between = text[block.end() : after.start()] if after else ""
                if after is not None and not between.strip():
                    if after.group(1) == "json":
                        ex.expected = json.loads(after.group(2))
                    elif after.group(1) == "text":
                        ex.expected = after.group(2)
                found.append(ex)
        for m in INLINE.finditer(text):
            if m.group(2).startswith("/admin/"):
                continue
            line = text[: m.start()].count("\n") + 1
            body = json.loads(m.group(3))
            found.append(Example(f"{name}:{line}", m.group(1), m.group(2), body))
    return found


EXAMPLES = collect()


def differences(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """Where ``actual`` does not contain ``expected`` (module docstring)."""
    if isinstance(expected, str) and ELLIPSIS in expected:
        return []
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected an object, got {actual!r}"]
        out = []
        for key, value in expected.items():
            if key in VOLATILE or ELLIPSIS in key:
                continue
            if key not in actual:
                out.append(f"{where}.{key}: missing")
            else:
                out += differences(value, actual[key], f"{where}.{key}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) < len(expected):
            return [f"{where}: expected at least {len(expected)} items, got {actual!r}"]
        return [
            d for i, v in enumerate(expected) for d in differences(v, actual[i], f"{where}[{i}]")
        ]
    if isinstance(expected, float) and not isinstance(expected, bool):
        return []
    return [] if expected == actual else [f"{where}: expected {expected!r}, got {actual!r}"]


SCORE = re.compile(r"\(score -?[0-9.]+\)")
CACHED = re.compile(r"^\(served from cache, [^)]*\)\n")


def plain(text: str) -> str:
    """A text answer without what differs per run: scores and the cache's first line."""
    return SCORE.sub("(score …)", CACHED.sub("", text)).strip()


@pytest.fixture(scope="module")
def sample_loaded(client: httpx.Client) -> None:
    docs = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line]
    r = client.post("/ingest/documents", json={"documents": docs})
    assert r.status_code == 200, r.text
    assert r.json()["failed"] == 0 and r.json()["indexed"] + r.json()["unchanged"] == len(docs)


def test_the_docs_have_request_examples():
    where = {e.where.split(":")[0] for e in EXAMPLES}
    assert {"README.md", "docs/api.md"} <= where, where
    assert sum(e.expected is not None for e in EXAMPLES) >= 5


def test_the_checker_sees_a_wrong_answer():
    assert plain("(served from cache, 3 s old)\n[1] A (score 0.84)") == "[1] A (score …)"
    assert plain("[1] A (score 0.84)") != plain("[1] B (score 0.84)")
    assert differences({"mode": "bm25", "matches": [{"title": "A"}]}, {"mode": "hybrid"})
    assert differences({"matches": [{"title": "A"}]}, {"matches": [{"title": "B"}]})
    assert not differences({"score": 0.5, "id": "x…"}, {"score": 0.1, "id": "xyz"})


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_the_example_answers_what_the_text_says(client, sample_loaded, example):
    r = client.request(example.method, example.path, json=example.body, headers=example.headers)
    assert r.status_code == 200, f"{example}: {r.status_code} {r.text[:500]}"
    if isinstance(example.expected, str):
        assert r.headers["content-type"].startswith("text/plain"), example
        assert plain(r.text) == plain(example.expected), f"{example}:\n{r.text}"
    elif example.expected is not None:
        problems = differences(example.expected, r.json())
        assert not problems, f"{example}:\n" + "\n".join(problems) + f"\n{r.text[:3000]}"
