"""Inside a Serve replica, our packages' log records go to Serve's own logger (``ray.serve``).

Serve sets up one logger per replica, ``ray.serve``, at the application's
``logging_config.log_level``, with the replica's log file (``logs/serve/replica_*.log``, JSON
when ``encoding: JSON``) and stderr as handlers and its filters adding ``request_id``,
``route``, ``application``, ``deployment`` and ``replica``. Our packages' loggers propagate to
the root logger, which in a Ray worker writes warnings and worse to stderr only: an INFO line
of a Graph, Retriever or Embedder replica (a warm-up's progress, a slow read) was written
nowhere. ``route_logs_to_serve()`` (once per process, first thing in each deployment's
constructor and the ingress') hands those packages' records to Serve's logger at its level;
outside a replica it changes nothing.
"""

from __future__ import annotations

import logging
import sys

from deployments.tracing import TraceIdFilter

SERVE_LOGGER = "ray.serve"
# Our packages' loggers, whose records go to Serve's log inside a replica.
PACKAGES = ("serve_app", "batch_ingest", "deployments")
_routed = False


class _ToServeLog(logging.Handler):
    """Hands each record to Serve's logger: its filters and its handlers."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(SERVE_LOGGER).handle(record)


def route_logs_to_serve(trace_filter: logging.Filter | None = None) -> bool:
    """Inside a Serve replica: our packages' records go to Serve's logger at its level (not to
    the root logger), and Serve's records pass ``trace_filter`` (default ``TraceIdFilter``:
    the current trace id as ``trace_id``). False, and nothing changes, anywhere else; a second
    call only adds a filter of another kind."""
    global _routed
    if not in_serve_replica():
        return False
    serve_logger = logging.getLogger(SERVE_LOGGER)
    wanted = trace_filter or TraceIdFilter()
    if not any(type(f) is type(wanted) for f in serve_logger.filters):
        serve_logger.addFilter(wanted)
    if _routed:
        return True
    forward = _ToServeLog()
    for name in PACKAGES:
        package = logging.getLogger(name)
        package.addHandler(forward)
        package.propagate = False  # Serve's stderr handler writes them already
        if serve_logger.level:
            package.setLevel(serve_logger.level)  # the application's logging_config.log_level
    _routed = True
    return True


def in_serve_replica() -> bool:
    """Whether this process is a Serve replica (without importing Ray when it is not)."""
    if "ray.serve" not in sys.modules:
        return False
    try:
        from ray import serve

        serve.get_replica_context()
    except Exception:  # RayServeException outside a replica
        return False
    return True
