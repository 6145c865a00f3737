"""Running means of a replica's own durations, for its ``status()`` (``/readyz`` shows them).

They tell an operator what a backend costs inside its replica, apart from the hop to it
(compare with the ingress's ``Server-Timing`` stages).
"""

from __future__ import annotations

import threading
import time


class MeanTimes:
    """Count and mean duration per name; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._total_ms: dict[str, float] = {}
        self._items: dict[str, int] = {}

    def add(self, name: str, started: float, items: int = 1) -> None:
        """Record ``time.perf_counter() - started`` under ``name`` (covering ``items``)."""
        elapsed = (time.perf_counter() - started) * 1000
        with self._lock:
            self._count[name] = self._count.get(name, 0) + 1
            self._total_ms[name] = self._total_ms.get(name, 0.0) + elapsed
            self._items[name] = self._items.get(name, 0) + items

    def snapshot(self) -> dict[str, float]:
        """``{"<name>_n": count, "<name>_mean_ms": mean, "<name>_mean_items": …}``."""
        out: dict[str, float] = {}
        with self._lock:
            for name, count in self._count.items():
                out[f"{name}_n"] = count
                out[f"{name}_mean_ms"] = round(self._total_ms[name] / count, 3)
                if self._items[name] != count:
                    out[f"{name}_mean_items"] = round(self._items[name] / count, 2)
        return out
