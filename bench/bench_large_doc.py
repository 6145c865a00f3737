"""One very large real-text document through a running gateway's asynchronous ingest path.

    python -m bench.bench_large_doc --url http://127.0.0.1:8000 [--chars 1950000] [--token T]

The document is the King James Bible's chapters in canonical order, joined with blank lines
and cut at ``--chars`` (the issue's case: 1.95 M characters, under the 2 M request limit).
It is posted to ``POST /ingest/documents``; a document above ``INGEST__SYNC_MAX_CHARS`` is
answered 202 with a job, which is followed at its ``status_url`` until it is done or failed.
Then the same document is posted again (it must be ``unchanged``: exactly once), and a search
for a sentence from its last part must find it. Prints a progress line every ``--poll-s``
and writes ``bench/results/large_doc-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import httpx

from bench.common import environment_info, setup_logging, write_result
from bench.realtext import kjv_chapters


def large_text(chars: int) -> str:
    """KJV chapters in canonical order, joined by blank lines, cut at ``chars``."""
    parts, size = [], 0
    for chapter in kjv_chapters("t"):
        block = f"{chapter['title']}\n\n{chapter['text']}"
        parts.append(block)
        size += len(block) + 2
        if size >= chars:
            break
    text = "\n\n".join(parts)
    if len(text) < chars:
        raise SystemExit(f"the KJV has only {len(text):,} characters; ask for fewer")
    return text[:chars]


def follow(client: httpx.Client, answer: httpx.Response, poll_s: float) -> dict[str, Any]:
    """The final body of an ingest: the 200 itself, or the job's once it is done/failed."""
    if answer.status_code == 200:
        return {"mode": "sync", **answer.json()}
    if answer.status_code != 202:
        raise SystemExit(f"ingest answered {answer.status_code}: {answer.text[:500]}")
    job = answer.json()
    url = job["status_url"]
    started = time.monotonic()
    while True:
        time.sleep(poll_s)
        body = client.get(url).json()
        print(f"  {time.monotonic() - started:6.1f}s job {job['job_id']}: {body.get('status')}")
        if body.get("status") in ("done", "failed"):
            return {"mode": "job", "job_id": job["job_id"], **body}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--token", default="", help="a bearer JWT that may write --team")
    p.add_argument("--team", default=f"bench_large_{uuid.uuid4().hex[:6]}")
    p.add_argument("--chars", type=int, default=1_950_000)
    p.add_argument("--poll-s", type=float, default=5.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    setup_logging()
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    text = large_text(args.chars)
    doc = {
        "team_id": args.team,
        "doc_id": "kjv-whole",
        "title": "The King James Bible (first part)",
        "text": text,
    }
    result: dict[str, Any] = {"chars": len(text), "team": args.team, "url": args.url}
    with httpx.Client(base_url=args.url, headers=headers, timeout=300) as client:
        started = time.monotonic()
        first = client.post("/ingest/documents", json={"documents": [doc]})
        result["first_answer"] = {
            "status": first.status_code,
            "seconds": round(time.monotonic() - started, 2),
        }
        print(
            f"posted {len(text):,} characters: {first.status_code} after "
            f"{result['first_answer']['seconds']} s"
        )
        final = follow(client, first, args.poll_s)
        took = time.monotonic() - started
        result["ingest"] = final
        result["took_s"] = round(took, 1)
        body = final.get("result") or final  # a job's body carries the ingest answer
        chunks = sum(d.get("chunks", 0) for d in body.get("documents", []) or [])
        result["chunks"] = chunks
        result["chunks_per_s"] = round(chunks / took, 1) if took else None
        print(
            f"ingest {final.get('status', final.get('mode'))} after {took:.1f} s: "
            f"{chunks} chunks, {result['chunks_per_s']} chunks/s"
        )
        again = follow(client, client.post("/ingest/documents", json={"documents": [doc]}), 2)
        again_body = again.get("result") or again
        result["again"] = {
            "mode": again["mode"],
            "statuses": [d["status"] for d in again_body.get("documents", [])],
        }
        print(f"posted again: {result['again']}")
        # A sentence near the end of the document must be found.
        tail = text[-3000:].split(". ")[1][:200]
        r = client.post("/rag/search_docs", json={"team_id": args.team, "query": tail, "top_k": 3})
        matches = r.json().get("matches", []) if r.status_code == 200 else []
        result["tail_search"] = {
            "status": r.status_code,
            "query": tail,
            "found": any(m["source_ref"]["id"] == "kjv-whole" for m in matches),
        }
        print(f"search for a sentence from the end: {result['tail_search']}")
    result["environment"] = environment_info()
    path = write_result("large_doc", result, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
