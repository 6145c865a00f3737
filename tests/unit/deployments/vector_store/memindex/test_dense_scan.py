"""The memory index's dense scan (deployments.vector_store.memindex.scan): the same scores,
to the bit, with one thread or several, and a busy pool never loses a block."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest

from deployments.protocols import ChunkRecord, SearchFilter
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.scan import BLOCK, PARALLEL_MIN_ROWS, DenseScan
from deployments.vector_store.memindex.team import TeamIndex


def matrix(rows: int, dim: int = 48, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((rows, dim)).astype(np.float32)
    return vectors, rng.standard_normal(dim).astype(np.float32)


@pytest.mark.parametrize("rows", [0, 1, BLOCK - 1, BLOCK + 3, PARALLEL_MIN_ROWS + 5, 41_000])
def test_scores_are_the_same_bits_with_any_number_of_threads(rows):
    vectors, query = matrix(rows)
    serial = DenseScan(1).scores(vectors, query)
    assert serial.shape == (rows,) and serial.dtype == np.float32
    np.testing.assert_allclose(serial, vectors @ query, rtol=1e-5, atol=1e-5)
    for threads in (2, 3, 4):
        scan = DenseScan(threads)
        try:
            assert np.array_equal(scan.scores(vectors, query), serial)
        finally:
            scan.close()


def test_a_group_the_pool_has_not_started_is_scanned_by_the_caller():
    """With the pool's only thread held elsewhere, a scan still finishes, every row scored."""
    vectors, query = matrix(PARALLEL_MIN_ROWS * 2)
    scan = DenseScan(2)
    release = threading.Event()
    blocker: Future = scan._executor().submit(release.wait, 30)
    try:
        out = scan.scores(vectors, query)
        assert not blocker.done()  # the pool was busy the whole scan
        assert np.array_equal(out, DenseScan(1).scores(vectors, query))
    finally:
        release.set()
        scan.close()


def test_one_thread_never_starts_a_pool():
    scan = DenseScan(1)
    vectors, query = matrix(PARALLEL_MIN_ROWS * 2)
    scan.scores(vectors, query)
    assert scan._pool is None


def test_at_least_one_thread():
    with pytest.raises(ValueError, match="at least one thread"):
        DenseScan(0)


def test_a_team_index_ranks_alike_with_a_shared_parallel_scan():
    rng = np.random.default_rng(3)
    rows = [
        ChunkRecord(
            chunk_id=f"c{i}",
            doc_id=f"d{i // 4}",
            team_id="t",
            chunk_index=i % 4,
            text=f"chunk {i}",
            title="",
            content_hash=f"h{i}",
            embed_model="m",
            vector=rng.standard_normal(16).astype(np.float32).tolist(),
        )
        for i in range(PARALLEL_MIN_ROWS + 100)
    ]
    query = rng.standard_normal(16).astype(np.float32).tolist()
    flt = compile_filter(SearchFilter(team_id="t"))
    scan = DenseScan(2)
    try:
        one, two = TeamIndex(dim=16), TeamIndex(dim=16, scan=scan)
        one.upsert(rows)
        two.upsert(rows)
        expect = [
            (h.chunk.chunk_id, h.score) for h in one.search("dense", flt, 25, query_vector=query)
        ]
        got = [
            (h.chunk.chunk_id, h.score) for h in two.search("dense", flt, 25, query_vector=query)
        ]
        assert got == expect
    finally:
        scan.close()


def test_a_busy_process_scans_in_one_thread():
    vectors, query = matrix(PARALLEL_MIN_ROWS * 2)
    busy = [True]
    scan = DenseScan(2, busy=lambda: busy[0])
    try:
        out = scan.scores(vectors, query)
        assert scan._pool is None  # nothing handed off while busy
        busy[0] = False
        assert np.array_equal(scan.scores(vectors, query), out)
        assert scan._pool is not None
    finally:
        scan.close()
