"""``Int8Pass``: an int8 first pass of the exact dense scan (COSINE and IP metrics), and the
float32 rescoring that keeps it exact.

The float32 scan reads the whole matrix per search (1.5 KB a row: 26 MB at 17,000 rows of 384
dimensions), and with it pushes the query model's weights out of the shared cache before the
next query (bench/README.md, "Search plumbing, ninth pass"). Here each full block of ``BLOCK``
rows also has an int8 copy (one symmetric scale per row), packed once (when a team loads, or
in the search after appends fill a block) for torch's dynamic int8 product
(``quantized::linear_dynamic``: the query quantized to 7-bit unsigned per tensor, so no
16-bit intermediate saturates; integer sums, exact). A quarter of the bytes. How far off an
int8 score can be is known per row and query (Cauchy–Schwarz on
``q·w − q̂·ŵ = (q − q̂)·w + q̂·(w − ŵ)``, ``q̂``/``ŵ`` as quantized):

    |q·w − q̂·ŵ| ≤ ‖q − q̂‖·‖w‖ + ‖q̂‖·‖w − ŵ‖   (+ float32 rounding of both products)

Every admitted row whose upper bound reaches the ``limit``-th best lower bound is rescored in
float32 (a few hundred of 17,000): the rows that can be in the float32 scan's top ``limit``,
with their float32 scores, so the index answers exactly what the float32 scan answers. Rows
past the last full block are scored in float32 directly; a repack renumbers the rows and the
blocks are made again.

Each search checks its rescored rows against their bounds: a row outside (a torch whose
dynamic quantization is not the one the bound reads back) switches the first pass off for
every team of the scan, and they scan in float32 from then on. It runs only where torch has
one intra-op thread (a Ray replica's); with more, OpenMP's threads spinning after each
product made a NumPy call beside them ~10× slower.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

import numpy as np

from deployments.vector_store.memindex.scan import BLOCK, DenseScan

logger = logging.getLogger(__name__)

# torch 2.10+ warns on every quantized tensor it makes; the kernels used here stay.
warnings.filterwarnings(
    "ignore",
    message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
    category=UserWarning,
)

UNIT = 2.0**-24  # float32 unit roundoff


class Int8Mismatch(RuntimeError):
    """A rescored row fell outside its bound: the int8 product is not the one the bound
    assumes, and the first pass cannot be trusted."""


@functools.cache
def int8_kernels() -> Any | None:
    """torch, when its dynamic int8 product runs here (``None``: scan in float32)."""
    try:
        import torch

        rows = torch.quantize_per_channel(
            torch.ones(2, 4),
            torch.ones(2, dtype=torch.float64),
            torch.zeros(2, dtype=torch.int64),
            0,
            torch.qint8,
        )
        packed = torch.ops.quantized.linear_prepack(rows, None)
        torch.ops.quantized.linear_dynamic(torch.ones(1, 4), packed, True)
    except Exception as exc:  # no torch, or no quantized engine on this CPU
        logger.info("int8 first pass unavailable, dense scans stay float32: %s", exc)
        return None
    return torch


@functools.cache
def _warn_threads(threads: int) -> None:
    logger.warning(
        "int8 first pass skipped: torch runs %d intra-op threads in this process, and its "
        "OpenMP threads spinning after each product cost a NumPy call beside it ~10x; the "
        "gateway's Ray replicas run one (OMP_NUM_THREADS)",
        threads,
    )


def _one_thread(torch: Any) -> bool:
    """Whether torch's products run on the calling thread alone here."""
    threads = int(torch.get_num_threads())
    if threads != 1:
        _warn_threads(threads)
    return threads == 1


class Int8Pass:
    """One team's int8 blocks (not thread-safe: ``TeamIndex`` calls it under its lock), used
    while ``scan.int8`` holds (shared by the teams of one ``HotIndex``)."""

    def __init__(self, dim: int, scan: DenseScan) -> None:
        self.dim = dim
        self.scan = scan
        self._blocks: list[Any] = []
        self._norms = np.zeros(0, np.float64)  # ‖w‖ of each row of the full blocks
        self._errors = np.zeros(0, np.float64)  # ‖w − ŵ‖
        self._packed_bytes = 0
        # How far a float32 dot product of ``dim`` terms can be from the exact one,
        # relative to ‖q‖·‖w‖ (γ_dim = dim·u / (1 − dim·u)).
        self._gamma = dim * UNIT / (1.0 - dim * UNIT)

    @property
    def rows(self) -> int:
        """Rows held in int8 (the full blocks)."""
        return len(self._blocks) * BLOCK

    @property
    def nbytes(self) -> int:
        return self._packed_bytes + self._norms.nbytes + self._errors.nbytes

    def reset(self) -> None:
        """Forget every block (the rows were renumbered)."""
        self._blocks.clear()
        self._norms = self._norms[:0]
        self._errors = self._errors[:0]
        self._packed_bytes = 0

    def top(
        self, vectors: np.ndarray, size: int, query: np.ndarray, mask: np.ndarray, limit: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The slots among ``mask`` that can be in the float32 scan's best ``limit`` (all of
        them are, and maybe a few more), with their float32 scores; ``None``: scan in float32
        (no block is full, no kernels here, or the first pass is off). A rescored row outside
        its bound switches it off for every team of the scan."""
        torch = self._kernels()
        if torch is None:
            return None
        try:
            return self._top(torch, vectors, size, query, mask, limit)
        except Int8Mismatch as exc:
            self.scan.int8 = False
            logger.error("int8 first pass switched off, dense scans are float32: %s", exc)
            return None

    def _top(
        self,
        torch: Any,
        vectors: np.ndarray,
        size: int,
        query: np.ndarray,
        mask: np.ndarray,
        limit: int,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        self._fill(torch, vectors, size)
        full = self.rows
        if full == 0 or limit <= 0:
            return None
        q32 = np.ascontiguousarray(query, dtype=np.float32)
        tq = torch.from_numpy(q32).reshape(1, -1)
        quantized = torch.quantize_per_tensor_dynamic(tq, torch.quint8, True)
        codes = quantized.int_repr().numpy()[0].astype(np.float64)
        q_hat = quantized.q_scale() * (codes - quantized.q_zero_point())
        q64 = q32.astype(np.float64)
        q_norm, q_hat_norm = float(np.linalg.norm(q64)), float(np.linalg.norm(q_hat))
        drift = float(np.linalg.norm(q64 - q_hat))
        approx = np.empty(full, np.float32)
        for i, packed in enumerate(self._blocks):
            out = torch.ops.quantized.linear_dynamic(tq, packed, True)
            approx[i * BLOCK : (i + 1) * BLOCK] = out.numpy()[0]
        # The bound above, plus the float32 rounding of the exact score (γ·‖q‖·‖w‖) and of
        # the int8 product's scaling (a few units of |q̂·ŵ| ≤ ‖q̂‖·(‖w‖ + ‖w − ŵ‖)).
        bound = (drift + self._gamma * q_norm + 8 * UNIT * q_hat_norm) * self._norms
        bound += q_hat_norm * (1.0 + 8 * UNIT) * self._errors
        bound += 1e-7
        admitted_q, admitted_t = mask[:full], mask[full:size]
        tail_rows = full + np.flatnonzero(admitted_t)
        tail_scores = vectors[tail_rows] @ q32
        if np.count_nonzero(admitted_q) + tail_rows.size <= limit:
            keep = np.flatnonzero(admitted_q)
        else:
            lower = np.where(admitted_q, approx - bound, -np.inf)
            pool = np.concatenate([lower, tail_scores.astype(np.float64)])
            kth = np.partition(pool, pool.size - limit)[pool.size - limit]
            keep = np.flatnonzero(admitted_q & (approx + bound >= kth))
            tail_keep = tail_scores >= kth
            tail_rows, tail_scores = tail_rows[tail_keep], tail_scores[tail_keep]
        exact = vectors[keep] @ q32
        if not np.all(np.abs(exact.astype(np.float64) - approx[keep]) <= bound[keep]):
            raise Int8Mismatch(
                "an int8 score fell outside its bound: torch's dynamic quantization is not "
                "the one the bound assumes"
            )
        return np.concatenate([keep, tail_rows]), np.concatenate([exact, tail_scores])

    def prepare(self, vectors: np.ndarray, size: int) -> None:
        """Make the blocks of the rows held now (a team's load does it in its loader thread,
        so its first search does not: ~18 ms a block)."""
        torch = self._kernels()
        if torch is not None:
            self._fill(torch, vectors, size)

    def _kernels(self) -> Any | None:
        """torch when the first pass runs here now: on for the scan, the kernels present,
        one intra-op thread."""
        if not self.scan.int8:
            return None
        torch = int8_kernels()
        return torch if torch is not None and _one_thread(torch) else None

    def _fill(self, torch: Any, vectors: np.ndarray, size: int) -> None:
        """Make the blocks that filled since the last call."""
        while self.rows + BLOCK <= size:
            start = self.rows
            rows = np.ascontiguousarray(vectors[start : start + BLOCK], dtype=np.float32)
            peak = np.abs(rows).max(axis=1).astype(np.float64)
            # float32 scales (what the packed kernel multiplies by), held as float64
            scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32).astype(np.float64)
            quantized = torch.quantize_per_channel(
                torch.from_numpy(rows),
                torch.from_numpy(scales),
                torch.zeros(BLOCK, dtype=torch.int64),
                0,
                torch.qint8,
            )
            # The bound is read back from what torch stored, not from what was asked for.
            codes = quantized.int_repr().numpy().astype(np.float64)
            stored = quantized.q_per_channel_scales().numpy().astype(np.float64)
            rows64 = rows.astype(np.float64)
            errors = np.linalg.norm(rows64 - codes * stored[:, None], axis=1)
            self._blocks.append(torch.ops.quantized.linear_prepack(quantized, None))
            self._norms = np.concatenate([self._norms, np.linalg.norm(rows64, axis=1)])
            self._errors = np.concatenate([self._errors, errors])
            self._packed_bytes += BLOCK * (self.dim + 16)
