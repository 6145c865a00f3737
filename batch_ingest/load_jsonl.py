"""Load documents from a JSON-lines file into a running gateway over HTTP, to the end.

    python -m batch_ingest.load_jsonl                      # the bundled sample corpus
    python -m batch_ingest.load_jsonl docs.jsonl --url http://127.0.0.1:8000 --workers 2
    python -m batch_ingest.load_jsonl docs.jsonl --resume  # after an interruption

Each line is one document with the fields of ``SourceDocument``. Every line is validated
before anything is sent, so a bad line stops the load with its line number and nothing
half-loaded (exit 2). Then batches of at most ``--batch-chars`` characters (and ``--batch``
documents) go ``--workers`` at a time; what the gateway refuses for a passing reason (408,
429, 5xx, a dropped connection) is retried with back-off, honouring ``Retry-After``; large
batches go through the asynchronous job path (batch_ingest/loader.py). A progress bar shows
documents, chunks and ETA; the summary names every document not loaded by line and id (exit 1).
Acknowledged lines are recorded in ``FILE.loaded``; ``--resume`` skips them. Re-running is
safe either way (ingestion is idempotent).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path

import httpx
from pydantic import ValidationError
from tqdm import tqdm

from batch_ingest.documents import SourceDocument
from batch_ingest.loader import Line, Loader, ResumeState, load

SAMPLE = Path(__file__).with_name("sample_corpus") / "sample.jsonl"
logger = logging.getLogger("batch_ingest.load_jsonl")


def read_documents(path: Path) -> list[Line]:
    """Parse and validate every line; raise ``SystemExit`` naming the first bad line."""
    docs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            SourceDocument.model_validate(raw)
        except (json.JSONDecodeError, ValidationError) as exc:
            print(f"{path}:{number}: {exc}", file=sys.stderr)
            raise SystemExit(2) from exc
        docs.append(Line(number, raw))
    return docs


def main(argv: list[str] | None = None, client: httpx.Client | None = None) -> int:
    """Run the CLI; ``client`` replaces the HTTP client built from ``--url`` (tests)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", type=Path, default=SAMPLE, help="JSON-lines file")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    parser.add_argument("--token", default="", help="bearer token, if the gateway wants one")
    parser.add_argument("--batch", type=int, default=64, help="documents per request, at most")
    parser.add_argument("--batch-chars", type=int, default=60_000, help="characters per request")
    parser.add_argument("--workers", type=int, default=2, help="requests at once")
    parser.add_argument("--max-attempts", type=int, default=10, help="tries per batch")
    parser.add_argument("--retry-for-s", type=float, default=900.0, help="retry a batch this long")
    parser.add_argument("--async-chars", type=int, default=150_000,
                        help="batches above this go through a background job")  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="skip lines already loaded")
    parser.add_argument("--state", type=Path, help="default: FILE.loaded")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    for name in ("batch", "batch_chars", "workers", "max_attempts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request: the bar says it

    lines = read_documents(args.file)
    state = ResumeState(args.state or args.file.with_name(args.file.name + ".loaded"), args.resume)
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(
                httpx.Client(base_url=args.url, timeout=300, headers=headers)
            )
        loader = Loader(
            client,
            max_attempts=args.max_attempts,
            retry_for_s=args.retry_for_s,
            async_chars=args.async_chars,
        )
        progress = stack.enter_context(
            tqdm(total=len(lines), unit="doc", disable=args.no_progress, mininterval=1.0)
        )
        totals = load(
            loader,
            lines,
            batch_chars=args.batch_chars,
            batch_docs=args.batch,
            workers=args.workers,
            state=state,
            progress=progress,
        )
    took = time.perf_counter() - started
    sent = totals.indexed + totals.unchanged
    print(
        f"done in {took:.1f} s: {totals.documents} documents, indexed {totals.indexed}, "
        f"unchanged {totals.unchanged}, already loaded {totals.skipped_done}, failed "
        f"{len(totals.failed)}; {totals.chunks} chunks ({totals.chunks / max(took, 1e-9):.1f}/s, "
        f"{sent / max(took, 1e-9):.1f} documents/s); {loader.retries} retries"
    )
    for number, doc_id, error in sorted(totals.failed):
        print(f"  not loaded: line {number} ({doc_id}): {error[:300]}")
    if totals.failed:
        print(f"re-run with --resume to send the {len(totals.failed)} documents again",
              file=sys.stderr)  # fmt: skip
    return 1 if totals.failed else 0


if __name__ == "__main__":
    sys.exit(main())
