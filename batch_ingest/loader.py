"""A bulk loader that always finishes: documents to a running gateway over HTTP, in batches
sized by characters, several requests at once, every refusal that passes retried.

- **Retries** (tenacity): 408, 425, 429, 500, 502, 503 and 504 answers, connection errors and
  timeouts are retried with exponential back-off and jitter (up to ``max_wait_s``), or after
  the ``Retry-After`` the gateway sent, until ``max_attempts`` tries or ``retry_for_s`` seconds;
  ingestion is idempotent, so a retry is always safe. Any other answer fails its batch at once
  (a 4xx names the problem: it will not pass).
- **Documents that failed** inside a 200 answer (``status: failed``, e.g. the graph was down)
  are sent again in a later pass, up to ``max_attempts`` passes; what still fails is reported
  by line and id, never dropped silently.
- **Batches by characters** (``batch_chars``, at most ``batch_docs`` documents); a batch above
  ``async_chars`` goes the asynchronous way (``Prefer: respond-async``, then its job is polled),
  as does any batch the gateway answers 202.
- **Resume**: each batch's line numbers are appended to a state file once the gateway
  acknowledged them; ``resume`` skips them.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
)

logger = logging.getLogger("batch_ingest.load_jsonl")

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Line:
    """One document of the input and where it came from."""

    number: int
    doc: dict[str, Any]

    @property
    def chars(self) -> int:
        return len(self.doc.get("text") or "")

    @property
    def doc_id(self) -> str:
        return str(self.doc.get("doc_id") or self.doc.get("id") or "?")


class Passing(Exception):
    """An answer worth retrying (or a transport error), with the wait the gateway asked."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Refused(Exception):
    """An answer that will not pass on a retry (the batch fails)."""


@dataclass
class Outcome:
    """What became of one batch."""

    lines: list[Line]
    indexed: int = 0
    unchanged: int = 0
    chunks: int = 0
    # Lines of documents the gateway answered ``failed`` (sent again in a later pass).
    failed: list[tuple[Line, str]] = field(default_factory=list)
    # The whole batch refused (after retries): its error.
    error: str = ""
    attempts: int = 1


def make_batches(lines: Iterable[Line], batch_chars: int, batch_docs: int) -> list[list[Line]]:
    """Consecutive lines in batches of at most ``batch_chars`` characters and ``batch_docs``
    documents (a longer document goes alone)."""
    out: list[list[Line]] = []
    current: list[Line] = []
    size = 0
    for line in lines:
        if current and (size + line.chars > batch_chars or len(current) >= batch_docs):
            out.append(current)
            current, size = [], 0
        current.append(line)
        size += line.chars
    if current:
        out.append(current)
    return out


def retry_after_s(response: httpx.Response) -> float | None:
    """The ``Retry-After`` of an answer in seconds (a number or an HTTP date), if any."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Loader:
    """Sends batches to ``client`` (an ``httpx.Client`` with the gateway's base URL; the
    caller's token in its headers)."""

    def __init__(
        self,
        client: httpx.Client,
        *,
        max_attempts: int = 10,
        retry_for_s: float = 900.0,
        max_wait_s: float = 60.0,
        async_chars: int = 150_000,
        poll_s: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.max_attempts = max_attempts
        self.retry_for_s = retry_for_s
        self.max_wait_s = max_wait_s
        self.async_chars = async_chars
        self.poll_s = poll_s
        self.sleep = sleep
        self.retries = 0
        self._lock = threading.Lock()

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        asked = getattr(exc, "retry_after", None)
        if asked is not None:
            return float(min(asked, self.max_wait_s))
        ceiling = min(self.max_wait_s, 0.5 * 2 ** (state.attempt_number - 1))
        return random.uniform(ceiling / 2, ceiling)

    def send(self, batch: list[Line]) -> Outcome:
        """One batch, retried while the answers pass; never raises."""
        outcome = Outcome(batch)
        retrying = Retrying(
            retry=retry_if_exception_type(Passing),
            wait=self._wait,
            stop=stop_after_attempt(self.max_attempts) | stop_after_delay(self.retry_for_s),
            sleep=self.sleep,
            reraise=True,
            before_sleep=self._count_retry,
        )
        try:
            body = retrying(self._post, batch)
        except (Passing, Refused) as exc:
            outcome.error = str(exc)
            outcome.attempts = retrying.statistics.get("attempt_number", 1)
            return outcome
        outcome.attempts = retrying.statistics.get("attempt_number", 1)
        by_id = {line.doc_id: line for line in batch}
        for result in body.get("documents", []):
            line = by_id.get(str(result.get("doc_id")))
            if line is None:
                continue
            status = result.get("status")
            if status == "failed":
                outcome.failed.append((line, str(result.get("error") or "failed")))
            elif status == "indexed":
                outcome.indexed += 1
                outcome.chunks += int(result.get("chunks") or 0)
            elif status == "unchanged":
                outcome.unchanged += 1
                outcome.chunks += int(result.get("chunks") or 0)
        return outcome

    def _count_retry(self, state: RetryCallState) -> None:
        with self._lock:
            self.retries += 1
        exc = state.outcome.exception() if state.outcome is not None else None
        logger.debug("retrying a batch (attempt %d): %s", state.attempt_number, exc)

    def _post(self, batch: list[Line]) -> dict[str, Any]:
        chars = sum(line.chars for line in batch)
        headers = {"prefer": "respond-async"} if chars > self.async_chars else {}
        try:
            r = self.client.post(
                "/ingest/documents", json={"documents": [x.doc for x in batch]}, headers=headers
            )
            if r.status_code == 202:
                r = self._follow(r.json()["status_url"])
        except httpx.TransportError as exc:  # connection refused or reset, a timeout
            raise Passing(f"{type(exc).__name__}: {exc}") from exc
        if r.status_code == 200:
            body: dict[str, Any] = r.json()
            return body
        message = f"HTTP {r.status_code} {r.text[:500]}"
        if r.status_code in RETRY_STATUSES:
            raise Passing(message, retry_after_s(r))
        raise Refused(message)

    def _follow(self, url: str) -> httpx.Response:
        """A background job's result as a 200 (a failed job as a 503: retried whole)."""
        while True:
            r = self.client.get(url)
            if r.status_code != 200:
                return r
            job = r.json()
            if job["status"] == "done":
                return httpx.Response(200, json=job["result"])
            if job["status"] == "failed":
                return httpx.Response(503, json={"error": "job_failed", "message": job["error"]})
            self.sleep(self.poll_s)


class ResumeState:
    """Line numbers the gateway acknowledged, appended to a file as they are."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = path
        self.done: set[int] = set()
        if resume and path.exists():
            for text in path.read_text(encoding="utf-8").splitlines():
                if text.strip():
                    self.done.update(json.loads(text))
        elif path.exists():
            path.unlink()

    def record(self, numbers: list[int]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(sorted(numbers)) + "\n")
        self.done.update(numbers)


@dataclass
class Totals:
    documents: int = 0
    indexed: int = 0
    unchanged: int = 0
    chunks: int = 0
    skipped_done: int = 0
    # (line number, doc id, error) of every document not loaded.
    failed: list[tuple[int, str, str]] = field(default_factory=list)


def load(
    loader: Loader,
    lines: list[Line],
    *,
    batch_chars: int,
    batch_docs: int,
    workers: int,
    state: ResumeState | None = None,
    progress: Any = None,
) -> Totals:
    """Send ``lines`` (those ``state`` has not seen) with ``workers`` requests at once, then
    the documents that failed, again, in up to ``loader.max_attempts`` passes."""
    totals = Totals(documents=len(lines))
    todo = [x for x in lines if state is None or x.number not in state.done]
    totals.skipped_done = len(lines) - len(todo)
    if progress is not None and totals.skipped_done:
        progress.update(totals.skipped_done)
    for attempt in range(1, loader.max_attempts + 1):
        again: list[tuple[Line, str]] = []
        refused: list[tuple[Line, str]] = []
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            batches = make_batches(todo, batch_chars, batch_docs)
            futures = [pool.submit(loader.send, b) for b in batches]
            for future in as_completed(futures):
                out = future.result()
                if out.error:
                    refused += [(line, out.error) for line in out.lines]
                    continue
                totals.indexed += out.indexed
                totals.unchanged += out.unchanged
                totals.chunks += out.chunks
                again += out.failed
                failed_numbers = {line.number for line, _ in out.failed}
                done = [x.number for x in out.lines if x.number not in failed_numbers]
                if state is not None and done:
                    state.record(done)
                if progress is not None:
                    progress.update(len(done))
                    progress.set_postfix(chunks=totals.chunks, retries=loader.retries)
        totals.failed += [(line.number, line.doc_id, error) for line, error in refused]
        if not again:
            break
        if attempt == loader.max_attempts:
            totals.failed += [(line.number, line.doc_id, error) for line, error in again]
            break
        logger.warning("%d documents failed; sending them again (pass %d)", len(again), attempt + 1)
        todo = [line for line, _ in again]
    return totals
