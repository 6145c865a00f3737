"""Audit log of every access decision: who asked, as which agent, in which team, for what,
allow or deny, why, and which chunks were returned.

One schema for SQLite (the default, a file under var/) and PostgreSQL (``audit.url``), written
with SQLAlchemy Core. The request path only appends to an in-memory queue; a background thread
writes batches. When the database is down, requests still answer: the records wait in memory
(up to ``audit.max_pending``), the writer retries, and ``status()`` (shown by /readyz) and the
``rag_gateway_audit_records`` metric (serve_app/metrics.py) say that the audit log is
degraded. ``close()`` (app shutdown, and at interpreter exit) writes what is still queued.

    python -m serve_app.audit query --since 1h --decision deny
    python -m serve_app.audit query --since 2026-11-30T00:00:00Z --subject alice --format json
    python -m serve_app.audit prune --before 30d

Records older than ``audit.retention_days`` (90 by default; 0 keeps every record) are deleted
by the gateway's writer thread once an hour, a batch at a time between the writes.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import hashlib
import json
import logging
import re
import sys
import threading
import time
import weakref
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from batch_ingest.audit_store import DECISIONS, AuditRecord, AuditStore, utcnow
from batch_ingest.documents import parse_iso
from batch_ingest.settings import AuditSettings
from serve_app.metrics import record_audit

if TYPE_CHECKING:
    from serve_app.auth.principal import Principal

logger = logging.getLogger(__name__)


def scope_resource(req: Any) -> str:
    """The audited resource of a search-scoped request: its team and project."""
    resource = f"team:{req.team_id}"
    if req.filters.project_id:
        resource += f"/project:{req.filters.project_id}"
    return resource


def request_audit(
    req: Any, principal: Principal, action: str, resource: str, text: str | None = None
) -> dict[str, Any]:
    """The audit fields of one tool request (``req`` has team_id, user_id, agent_id)."""
    from serve_app.access.context import DEV_SUBJECT

    fields: dict[str, Any] = {
        "action": action,
        "team_id": req.team_id,
        "resource": resource,
        "declared_agent_id": req.agent_id if not principal.agent_id else "",
        # A dev-mode caller has no verified subject; the body's user_id is all there is.
        "subject": (req.user_id or DEV_SUBJECT) if principal.trusts_body else principal.sub,
    }
    if text is not None:
        fields |= {"query_sha256": sha256_text(text), "query_text": text}
    return fields


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_OPEN_LOGS: weakref.WeakSet[AuditLog] = weakref.WeakSet()


@atexit.register
def _close_open_logs() -> None:
    for log in list(_OPEN_LOGS):
        log.close()


def _error_line(exc: BaseException) -> str:
    """An error as one short line for /readyz: its type and the first line of its message."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:300]}"


class AuditLog:
    """Asynchronous writer over an ``AuditStore``: ``record()`` only enqueues."""

    def __init__(self, settings: AuditSettings, store: AuditStore | None = None) -> None:
        self.settings = settings
        self.enabled = settings.enabled
        self.store = store
        if self.enabled and self.store is None:
            self.store = AuditStore(settings.url, settings.table)
        self._pending: collections.deque[AuditRecord] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False
        self.written = 0
        self.dropped = 0
        self.failures = 0
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None
        self.healthy = True
        self.pruned = 0
        self.prune_error: str | None = None
        self._pruned_at: float | None = None  # monotonic; None: not yet in this process
        if self.enabled:
            _OPEN_LOGS.add(self)

    @classmethod
    def disabled(cls) -> AuditLog:
        return cls(AuditSettings(enabled=False))

    # --- request path ---------------------------------------------------------------------
    def record(self, rec: AuditRecord) -> None:
        """Queue ``rec`` for writing; never blocks on the database, never raises."""
        if not self.enabled:
            return
        if rec.query_text is not None and not self.settings.store_query_text:
            rec.query_text = None
        with self._cond:
            if self._closed:
                # After shutdown: write synchronously rather than lose it.
                self._write([rec])
                return
            self._pending.append(rec)
            overflow = len(self._pending) - self.settings.max_pending
            for _ in range(max(0, overflow)):
                self._pending.popleft()
                self.dropped += 1
                record_audit("dropped")
            if overflow > 0:
                logger.error("audit queue full: %d oldest records dropped", overflow)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
                self._thread.start()
            if len(self._pending) >= self.settings.batch_size:
                self._cond.notify_all()

    # --- writer thread ----------------------------------------------------------------------
    def _write(self, batch: list[AuditRecord]) -> bool:
        assert self.store is not None
        try:
            self.store.insert(batch)
        except Exception as exc:
            self.failures += 1
            record_audit("failed", len(batch))
            if self.healthy:
                logger.error("audit log DEGRADED: cannot write to %s: %s", self.store.backend, exc)
            self.healthy = False
            self.last_error = _error_line(exc)
            self.last_error_at = utcnow()
            return False
        if not self.healthy:
            logger.warning("audit log recovered; writing again")
        self.healthy = True
        self.written += len(batch)
        record_audit("written", len(batch))
        return True

    def _take(self) -> list[AuditRecord]:
        n = min(len(self._pending), self.settings.batch_size)
        return [self._pending.popleft() for _ in range(n)]

    def _run(self) -> None:
        cfg = self.settings
        while True:
            with self._cond:
                if not self._pending and not self._closed:
                    self._cond.wait(cfg.flush_interval_s)
                elif len(self._pending) < cfg.batch_size and not self._closed:
                    # Let a batch fill for at most one interval.
                    self._cond.wait_for(
                        lambda: len(self._pending) >= cfg.batch_size or self._closed,
                        cfg.flush_interval_s,
                    )
                if self._closed and not self._pending:
                    return
                batch = self._take()
                self._busy = bool(batch)
            if not batch:
                self._prune_when_due()
                continue
            ok = self._write(batch)
            with self._cond:
                self._busy = False
                if not ok:
                    # Keep them, in order, for the next attempt.
                    self._pending.extendleft(reversed(batch))
                self._cond.notify_all()
                if not ok:
                    if self._closed:
                        return
                    self._cond.wait(cfg.retry_interval_s)
            if ok:
                self._prune_when_due()

    def _prune_when_due(self) -> None:
        """Delete the records past ``audit.retention_days``: at the writer's first chance in
        this process, then once per ``audit.prune_interval_s``, ``audit.prune_batch`` rows
        per transaction. Records waiting to be written go first: a prune stops between
        batches when a batch of them is waiting (or the log closes) and goes on at the
        writer's next idle moment. A failure is logged and tried again an interval later."""
        cfg = self.settings
        if cfg.retention_days <= 0 or self.store is None:
            return
        now = time.monotonic()
        if self._pruned_at is not None and now - self._pruned_at < cfg.prune_interval_s:
            return
        cutoff = utcnow() - timedelta(days=cfg.retention_days)
        total = 0
        try:
            while True:
                deleted = self.store.prune(cutoff, cfg.prune_batch)
                self.pruned += deleted
                total += deleted
                if deleted < cfg.prune_batch:
                    break  # nothing older left
                with self._cond:
                    if self._closed or len(self._pending) >= cfg.batch_size:
                        return  # not done: the next idle moment goes on
        except Exception as exc:
            self.prune_error = _error_line(exc)
            logger.warning("audit log: records older than %s not deleted: %s", cutoff, exc)
            self._pruned_at = now
            return
        self.prune_error = None
        self._pruned_at = now
        if total:
            logger.info(
                "audit log: %d records older than %g days deleted", total, cfg.retention_days
            )

    # --- control ---------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued record is written; False when it could not be."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.notify_all()
            while self._pending or self._busy:
                if self._thread is None or not self._thread.is_alive():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
                self._cond.notify_all()
            rest = list(self._pending)
            self._pending.clear()
        return self._write(rest) if rest else True

    def close(self) -> None:
        """Write what is queued (up to ``shutdown_timeout_s``) and stop the writer."""
        if not self.enabled or self._closed:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(self.settings.shutdown_timeout_s)
        with self._cond:
            rest = list(self._pending)
            self._pending.clear()
        if rest and not self._write(rest):
            self.dropped += len(rest)
            record_audit("dropped", len(rest))
            logger.error("audit log: %d records lost at shutdown (%s)", len(rest), self.last_error)
        _OPEN_LOGS.discard(self)

    def status(self) -> dict[str, Any]:
        """For /readyz: whether the database answers, and the writer's counters."""
        if not self.enabled:
            return {"ready": True, "enabled": False}
        assert self.store is not None
        error = None
        try:
            self.store.ping()
        except Exception as exc:
            error = _error_line(exc)
        ready = error is None and self.healthy
        out: dict[str, Any] = {
            "ready": ready,
            "degraded": not ready,
            "backend": self.store.backend,
            "pending": len(self._pending),
            "written": self.written,
            "dropped": self.dropped,
            "write_failures": self.failures,
            "retention_days": self.settings.retention_days,
            "pruned": self.pruned,
        }
        if self.prune_error:
            out["prune_error"] = self.prune_error
        if error or self.last_error:
            out["error"] = error or self.last_error
        return out

    def query(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        if self.store is None:
            raise RuntimeError("the audit log is disabled (audit.enabled=false)")
        return self.store.query(*args, **kwargs)


# --- CLI ---------------------------------------------------------------------------------
_RELATIVE = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_time(value: str, now: datetime | None = None) -> datetime:
    """ISO 8601 (naive = UTC) or a span back from now: ``30m``, ``6h``, ``7d``."""
    value = value.strip()
    rel = _RELATIVE.match(value)
    if rel:
        return (now or utcnow()) - timedelta(**{_UNITS[rel.group(2)]: int(rel.group(1))})
    return parse_iso(value)


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """An audit row with its timestamps as ISO 8601 strings (the CLI's and the API's)."""
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_app.audit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("query", help="list decisions, newest first")
    q.add_argument("--url", help="database URL (default: AUDIT__URL / settings)")
    q.add_argument("--since", type=parse_time, help="ISO 8601 or 30m / 6h / 7d ago")
    q.add_argument("--until", type=parse_time)
    q.add_argument("--subject")
    q.add_argument("--decision", choices=DECISIONS)
    q.add_argument("--team-id")
    q.add_argument("--action")
    q.add_argument("--trace-id")
    q.add_argument("--limit", type=int, default=100)
    q.add_argument("--format", choices=["table", "json"], default="table")
    pr = sub.add_parser("prune", help="delete the records older than a date or a span")
    pr.add_argument("--url", help="database URL (default: AUDIT__URL / settings)")
    pr.add_argument("--before", type=parse_time, required=True, help="ISO 8601 or 30d / 12w ago")
    args = parser.parse_args(argv)

    from serve_app.settings import GatewaySettings

    cfg = GatewaySettings().audit
    store = AuditStore(args.url or cfg.url, cfg.table)
    if args.command == "prune":
        return _prune(store, args.before, cfg.prune_batch)
    try:
        rows = store.query(
            args.since,
            args.until,
            args.subject,
            args.decision,
            args.team_id,
            args.limit,
            action=args.action,
            trace_id=args.trace_id,
        )
    finally:
        store.dispose()
    if args.format == "json":
        for row in rows:
            print(json.dumps(jsonable(row), ensure_ascii=False))
        return 0
    cols = ("ts", "decision", "reason", "http_status", "action", "subject", "team_id", "trace_id")
    print("\t".join(cols))
    for row in rows:
        print("\t".join(str(jsonable(row)[c]) for c in cols))
    return 0


def _prune(store: AuditStore, before: datetime, batch: int) -> int:
    """``prune``: the records before ``before`` deleted a batch at a time, with progress."""
    total = 0
    try:
        while True:
            deleted = store.prune(before, batch)
            total += deleted
            if deleted < batch:
                break
            print(f"{total} records deleted so far", file=sys.stderr)
    finally:
        store.dispose()
    print(f"{total} records older than {before.isoformat()} deleted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
