"""Load documents from a JSON-lines file into a running gateway over HTTP.

    python -m batch_ingest.load_jsonl                      # the bundled sample corpus
    python -m batch_ingest.load_jsonl docs.jsonl --url http://127.0.0.1:8000 --batch 32

Each line is one document with the fields of ``SourceDocument``. Every line is validated
before anything is sent, so a bad line stops the load with its line number and nothing
half-loaded; re-running is safe (ingestion is idempotent).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import httpx
from pydantic import ValidationError

from batch_ingest.documents import SourceDocument

SAMPLE = Path(__file__).with_name("sample_corpus") / "sample.jsonl"
logger = logging.getLogger("batch_ingest.load_jsonl")


def read_documents(path: Path) -> list[dict]:
    """Parse and validate every line; raise ``SystemExit`` naming the first bad line."""
    docs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            SourceDocument.model_validate(raw)
        except (json.JSONDecodeError, ValidationError) as exc:
            raise SystemExit(f"{path}:{number}: {exc}") from exc
        docs.append(raw)
    return docs


def wait_for_job(client: httpx.Client, url: str, poll_s: float = 2.0) -> httpx.Response:
    """Poll a background ingestion job until it ends; its result as a 200 answer (or the
    failed job's error as a 500-class one, so the caller stops)."""
    while True:
        r = client.get(url)
        if r.status_code != 200:
            return r
        job = r.json()
        if job["status"] == "done":
            return httpx.Response(200, json=job["result"])
        if job["status"] == "failed":
            return httpx.Response(500, json={"error": "job_failed", "message": job["error"]})
        logger.info("job %s %s (attempt %d)", job["job_id"], job["status"], job["attempts"])
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", type=Path, default=SAMPLE, help="JSON-lines file")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    parser.add_argument("--batch", type=int, default=32, help="documents per request")
    parser.add_argument("--token", default="", help="bearer token, if the gateway wants one")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    docs = read_documents(args.file)
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    totals = {"indexed": 0, "unchanged": 0, "failed": 0}
    started = time.perf_counter()
    with httpx.Client(base_url=args.url, timeout=300, headers=headers) as client:
        for start in range(0, len(docs), args.batch):
            batch = docs[start : start + args.batch]
            r = client.post("/ingest/documents", json={"documents": batch})
            if r.status_code == 202:  # too long for one request: indexed in the background
                r = wait_for_job(client, r.json()["status_url"])
            if r.status_code != 200:
                logger.error("batch at line %d refused: HTTP %d %s", start + 1, r.status_code,
                             r.text[:2000])  # fmt: skip
                return 1
            body = r.json()
            for key in totals:
                totals[key] += body[key]
            done = start + len(batch)
            rate = done / (time.perf_counter() - started)
            logger.info("%d/%d documents (%.1f docs/s, ETA %.0fs)%s", done, len(docs), rate,
                        (len(docs) - done) / rate if rate else 0,
                        " degraded: " + "; ".join(body["degraded_reasons"]) if body["degraded"]
                        else "")  # fmt: skip
    logger.info("done: %s", ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
