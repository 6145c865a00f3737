"""The trace id of the work in progress (an HTTP request, a bus event), W3C ``traceparent``,
and log records that carry it.

- ``TRACE_ID`` (a ``ContextVar``) holds the current trace id; ``trace_context(id)`` sets it for
  a block (asyncio tasks and ``asyncio.to_thread`` calls started inside inherit it).
- ``parse_traceparent`` reads a W3C Trace Context header
  (``00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>``); anything invalid is ``None``
  (the header is then ignored, as the W3C rules say): not lowercase hex, version ``ff``, an
  all-zero trace or parent id, a version-00 header with more fields. A later version is read
  by its first four fields. ``traceparent_for`` builds the one to answer with: the same trace
  id, a new span id.
- ``TraceIdFilter`` puts ``trace_id`` on every ``LogRecord`` it sees (``""`` when none; a
  ``trace_id`` passed in ``extra`` wins); ``JsonFormatter`` writes one JSON object per record;
  ``configure_logging`` sets up a command-line process (``--log-format json|text``).
- ``keep_log_handlers()``: inside it, ``logging.config.dictConfig`` (which a library may call
  when first imported, pymilvus does) leaves the handlers already installed open, so a Serve
  replica's log file keeps its lines.

The lowest layer on purpose: the gateway (serve_app), the bus consumer (batch_ingest) and the
deployments all use the one variable.
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import secrets
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

TRACE_ID: ContextVar[str] = ContextVar("trace_id", default="")

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def current_trace_id() -> str:
    """The trace id of the work in progress, ``""`` when none."""
    return TRACE_ID.get()


def set_trace_id(trace_id: str) -> Token[str]:
    """Make ``trace_id`` current; give the token back to ``TRACE_ID.reset``."""
    return TRACE_ID.set(trace_id)


@contextmanager
def trace_context(trace_id: str) -> Iterator[None]:
    """``trace_id`` is the current trace id inside the block (``""``: none)."""
    token = TRACE_ID.set(trace_id)
    try:
        yield
    finally:
        TRACE_ID.reset(token)


def new_trace_id() -> str:
    """A fresh trace id: 32 lowercase hex digits (a uuid4), valid in a ``traceparent``."""
    return uuid.uuid4().hex


def new_span_id() -> str:
    """A fresh span (parent) id: 16 lowercase hex digits, never all zeros."""
    while True:
        span = secrets.token_hex(8)
        if span != _ZERO_SPAN:
            return span


def is_w3c_trace_id(value: str) -> bool:
    """``value`` can be the trace id of a ``traceparent`` (32 lowercase hex, not all zeros)."""
    return bool(_TRACE_ID.fullmatch(value)) and value != _ZERO_TRACE


@dataclass(frozen=True)
class TraceParent:
    version: str
    trace_id: str
    parent_id: str
    flags: str

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 0x01)


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The W3C ``traceparent`` in ``value``, or ``None`` when it is missing or invalid."""
    if not value:
        return None
    match = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(version, trace_id, parent_id, flags)


def single_traceparent(values: list[str]) -> TraceParent | None:
    """The ``traceparent`` of a request's header values: one valid header; none or two (which
    the W3C rules make invalid) are ``None``."""
    return parse_traceparent(values[0]) if len(values) == 1 else None


def traceparent_for(trace_id: str, sampled: bool = False) -> str | None:
    """The version-00 ``traceparent`` to answer with: ``trace_id`` and a new span id; ``None``
    when ``trace_id`` is not a W3C trace id (an ``X-Trace-Id`` in another format)."""
    if not is_w3c_trace_id(trace_id):
        return None
    return f"00-{trace_id}-{new_span_id()}-{'01' if sampled else '00'}"


# --- log records -----------------------------------------------------------------------------


class TraceIdFilter(logging.Filter):
    """Adds ``trace_id`` (the current one, ``""`` when none) to every record; filters nothing.
    Install it on a handler: a logger's own filters do not see its children's records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "trace_id", None):
            record.trace_id = TRACE_ID.get()
        return True


# The attributes every LogRecord has; the others came in through ``extra`` (or a filter).
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO-8601), ``level``, ``logger``, ``message``,
    ``trace_id``, then the record's ``extra`` attributes; ``exc_info`` (the traceback text)
    when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "trace_id": getattr(record, "trace_id", ""),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``fmt``, then `` trace_id=<id>`` when the record has one."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        text = super().formatMessage(record)
        trace_id = getattr(record, "trace_id", "")
        return f"{text} trace_id={trace_id}" if trace_id else text


LOG_FORMATS = ("text", "json")


def configure_logging(
    log_format: str = "text",
    *,
    level: int = logging.INFO,
    text_format: str = "%(asctime)s %(levelname)s %(name)s: %(message)s",
    stream: TextIO | None = None,
) -> None:
    """A command-line process's logging (``logging.basicConfig`` on ``stream``, default
    stderr; nothing changes when the root logger has handlers already): ``json`` = one
    ``JsonFormatter`` object per line, ``text`` = ``text_format`` plus `` trace_id=…`` when
    there is one.

    Raises:
        ValueError: a format other than ``text`` or ``json``.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(TraceIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(text_format))
    logging.basicConfig(level=level, handlers=[handler])


@contextmanager
def keep_log_handlers() -> Iterator[None]:
    """Inside the block, ``logging.config.dictConfig`` configures what it is given without
    first closing every handler of the process, which it otherwise does (even with
    ``disable_existing_loggers: False``).

    Why: pymilvus calls ``dictConfig`` when it is first imported, and the deployments import it
    lazily, after Serve has set up the replica's logger. Serve's file handler is a
    ``MemoryHandler`` in front of the replica's log file; closed, it forgets its target and
    from then on keeps every record in memory and writes none, so that replica's
    ``logs/serve/replica_*.log`` stopped after its start lines while its stderr (a stream
    handler, which works on after ``close``) still had every call, and the records piled up
    in the replica's memory. Import such a library in this block
    (``deployments.vector_store.client.import_pymilvus``).

    How: ``dictConfig`` (and ``fileConfig``) begin with ``logging.config._clearExistingHandlers``
    (CPython since 3.2); it is a no-op while the block runs. A Python without it leaves this a
    no-op too, and tests/unit/deployments/test_replica_log_handlers.py says whether handlers
    survive.
    """
    clear = getattr(logging.config, "_clearExistingHandlers", None)
    if clear is None:
        yield
        return
    logging.config._clearExistingHandlers = _keep  # type: ignore[attr-defined]
    try:
        yield
    finally:
        logging.config._clearExistingHandlers = clear  # type: ignore[attr-defined]


def _keep() -> None:
    """``dictConfig``'s first step, made a no-op by ``keep_log_handlers``."""
