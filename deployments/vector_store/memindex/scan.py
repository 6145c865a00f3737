"""``DenseScan``: the exact dense scan of the in-memory index (every row · the query), in fixed
blocks of rows that up to ``threads`` threads share.

NumPy releases the GIL inside its BLAS call, so two threads scan two halves of the matrix at
once; a search at one caller then uses the core that waits for it (bench/README.md, "Search
plumbing, fourth pass"), and a process serving other requests too scans in one thread
(``busy``). OpenBLAS's own threads are no substitute: they spin between calls
(≈6 ms of CPU per 0.6 ms scan, measured) and a Ray replica pins them to one anyway.

The scores do not depend on how many threads ran: every block is one BLAS call over the same
``BLOCK`` rows, whichever thread makes it. A group of blocks handed to the pool that has not
started when the caller finishes its own group is taken back and scanned by the caller, so a
busy pool costs a scan nothing beyond the serial one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

BLOCK = 4096  # rows per BLAS call
# Below this many rows the hand-off to another thread costs more than it saves.
PARALLEL_MIN_ROWS = 4 * BLOCK


class DenseScan:
    """``scores(vectors, query)`` = ``vectors @ query`` over blocks of rows.

    Args:
        threads: threads one scan may use, the caller's included (1: the caller alone).
        busy: when given and true, the process serves other requests too and no core waits:
            the caller scans alone (the Ingress passes its in-flight count's ``busy``).
        int8: the teams searched with this scan keep an int8 first pass of their full blocks
            (``int8.Int8Pass``; COSINE and IP), the answers unchanged. Switched off for good
            when a search finds the int8 product off its bound.
    """

    def __init__(
        self, threads: int = 1, busy: Callable[[], bool] | None = None, int8: bool = False
    ) -> None:
        if threads < 1:
            raise ValueError(f"a scan needs at least one thread, got {threads}")
        self.threads = threads
        self.busy = busy
        self.int8 = int8
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def scores(self, vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
        n = vectors.shape[0]
        out = np.empty(n, dtype=np.result_type(vectors.dtype, query.dtype))
        starts = list(range(0, n, BLOCK))
        if self.threads == 1 or n < PARALLEL_MIN_ROWS or (self.busy is not None and self.busy()):
            _scan(vectors, query, out, starts)
            return out
        size = -(-len(starts) // self.threads)
        groups = [starts[i : i + size] for i in range(0, len(starts), size)]
        pool = self._executor()
        handed = [pool.submit(_scan, vectors, query, out, group) for group in groups[1:]]
        _scan(vectors, query, out, groups[0])
        for future, group in zip(handed, groups[1:], strict=True):
            if future.cancel():  # not started: the pool is busy, scan it here
                _scan(vectors, query, out, group)
            else:
                future.result()
        return out

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.threads - 1, thread_name_prefix="memindex-scan"
                )
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None


def _scan(vectors: np.ndarray, query: np.ndarray, out: np.ndarray, starts: list[int]) -> None:
    for start in starts:
        end = start + BLOCK
        np.matmul(vectors[start:end], query, out=out[start:end])
