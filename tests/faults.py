"""Faults injected into product code by wrapping what it is given (never by flags in it)."""

from __future__ import annotations

from typing import Any


class InjectedFailure(RuntimeError):
    """The crash ``failing_after`` injects."""


def failing_after(docs: int) -> Any:
    """A ``Reindexer(wrap_sink=...)`` that crashes the job once ``docs`` documents are
    recorded: the next batch is embedded and written, but never recorded."""

    def wrap(sink: Any) -> Any:
        recorded = 0

        def failing(rows: list[dict[str, Any]]) -> None:
            nonlocal recorded
            if recorded >= docs:
                raise InjectedFailure(f"injected failure after {recorded} documents")
            sink(rows)
            recorded += len(rows)

        return failing

    return wrap
