"""The int8 first pass of the memory index's dense scan (deployments.vector_store.memindex.int8):
a team searched with it answers what the float32 scan answers — the same chunks in the same
order, the same float32 scores up to the last bit of a BLAS call — through filters, limits,
writes across a block boundary, deletes and a repack; a product off its bound switches it off."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.protocols import ChunkRecord, SearchFilter
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex import int8 as int8_module
from deployments.vector_store.memindex.scan import BLOCK, DenseScan
from deployments.vector_store.memindex.team import TeamIndex

pytestmark = pytest.mark.skipif(
    int8_module.int8_kernels() is None, reason="torch's dynamic int8 product is not available"
)

DIM = 32


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The first pass runs where torch has one intra-op thread (a Ray replica's)."""
    torch = int8_module.int8_kernels()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rows(start: int, count: int, rng: np.random.Generator, dim: int = DIM) -> list[ChunkRecord]:
    vectors = rng.standard_normal((count, dim)).astype(np.float32)
    # Near-duplicates too, so the top is crowded with close scores.
    vectors[::7] = vectors[::7] * 0.01 + vectors[0]
    return [
        ChunkRecord(
            chunk_id=f"c{start + i}",
            doc_id=f"d{(start + i) % 11}",
            team_id="t",
            chunk_index=start + i,
            text="text",
            title="",
            content_hash="h",
            embed_model="m",
            doc_type=("doc", "wiki", "note")[(start + i) % 3],
            vector=vectors[i].tolist(),
        )
        for i in range(count)
    ]


def pair(metric: str = "COSINE") -> tuple[TeamIndex, TeamIndex]:
    """(float32, int8 first pass) indexes of one team."""
    return (
        TeamIndex(dim=DIM, metric=metric, scan=DenseScan(1)),
        TeamIndex(dim=DIM, metric=metric, scan=DenseScan(1, int8=True)),
    )


FILTERS = [
    SearchFilter(team_id="t"),
    SearchFilter(team_id="t", doc_types=("wiki",)),
    SearchFilter(team_id="t", doc_ids=("d3",)),
]


def assert_same_answers(exact: TeamIndex, fast: TeamIndex, rng: np.random.Generator) -> None:
    for flt in FILTERS:
        compiled = compile_filter(flt)
        for limit in (1, 10, 120, 5000):
            for _ in range(8):
                query = rng.standard_normal(DIM).astype(np.float32).tolist()
                want = exact.search("dense", compiled, limit, query_vector=query)
                got = fast.search("dense", compiled, limit, query_vector=query)
                assert [h.chunk.chunk_id for h in got] == [h.chunk.chunk_id for h in want]
                np.testing.assert_allclose(
                    [h.score for h in got], [h.score for h in want], rtol=1e-5, atol=1e-6
                )
    assert fast._scan.int8  # no rescored row fell outside its bound


@pytest.mark.parametrize("metric", ["COSINE", "IP"])
def test_the_first_pass_answers_what_the_float32_scan_answers(metric):
    rng = np.random.default_rng(3)
    exact, fast = pair(metric)
    batch = rows(0, 2 * BLOCK + 300, rng)  # two full blocks and a float32 tail
    exact.upsert(batch)
    fast.upsert(batch)
    assert_same_answers(exact, fast, rng)
    assert fast._int8 is not None and fast._int8.rows == 2 * BLOCK


def test_writes_fill_a_block_later_and_a_repack_starts_over():
    rng = np.random.default_rng(5)
    exact, fast = pair()
    first = rows(0, BLOCK - 10, rng)
    exact.upsert(first)
    fast.upsert(first)
    assert_same_answers(exact, fast, rng)  # no full block yet: float32 throughout
    assert fast._int8 is not None and fast._int8.rows == 0
    more = rows(BLOCK - 10, 40, rng)
    exact.upsert(more)
    fast.upsert(more)
    assert_same_answers(exact, fast, rng)
    assert fast._int8.rows == BLOCK
    # Replace some rows, delete most others: their slots die, then the rows are renumbered.
    again = rows(0, 50, np.random.default_rng(9))
    exact.upsert(again)
    fast.upsert(again)
    assert_same_answers(exact, fast, rng)
    gone = [f"c{i}" for i in range(60, BLOCK - 200)]
    exact.remove(gone)
    fast.remove(gone)
    assert len(fast) < BLOCK
    assert fast._int8.rows == 0  # repacked: no full block left
    assert_same_answers(exact, fast, rng)


def test_a_product_off_its_bound_switches_the_first_pass_off(monkeypatch):
    rng = np.random.default_rng(11)
    exact, fast = pair()
    batch = rows(0, BLOCK + 100, rng)
    exact.upsert(batch)
    fast.upsert(batch)
    fast.prepare_scan()  # the block made with the real kernels
    torch = int8_module.int8_kernels()
    real = torch.ops.quantized.linear_dynamic

    class Off:
        def linear_dynamic(self, *args):
            return real(*args) + 0.5  # a kernel that is not the one the bound assumes

    monkeypatch.setattr(torch.ops, "quantized", Off())
    query = rng.standard_normal(DIM).astype(np.float32).tolist()
    flt = compile_filter(FILTERS[0])
    got = fast.search("dense", flt, 20, query_vector=query)
    want = exact.search("dense", flt, 20, query_vector=query)
    assert [h.chunk.chunk_id for h in got] == [h.chunk.chunk_id for h in want]
    assert fast._scan.int8 is False  # float32 from now on, for every team of the scan


@pytest.mark.parametrize("why", ["no kernels", "two torch threads"])
def test_where_it_cannot_run_the_scan_stays_float32(monkeypatch, why):
    if why == "no kernels":
        monkeypatch.setattr(int8_module, "int8_kernels", lambda: None)
    else:
        int8_module.int8_kernels().set_num_threads(2)
    rng = np.random.default_rng(13)
    exact, fast = pair()
    batch = rows(0, BLOCK + 5, rng)
    exact.upsert(batch)
    fast.upsert(batch)
    assert_same_answers(exact, fast, rng)
    assert fast._int8 is not None and fast._int8.rows == 0


def test_a_loaded_team_has_its_blocks_before_its_first_search():
    rng = np.random.default_rng(23)
    _, fast = pair()
    fast.upsert(rows(0, 2 * BLOCK + 1, rng))
    fast.prepare_scan()
    assert fast._int8 is not None and fast._int8.rows == 2 * BLOCK


def test_l2_keeps_no_int8_copy():
    assert TeamIndex(dim=DIM, metric="L2", scan=DenseScan(1, int8=True))._int8 is None


def test_the_rows_rescored_are_few_and_cover_the_top():
    rng = np.random.default_rng(17)
    vectors = rng.standard_normal((3 * BLOCK, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    first = int8_module.Int8Pass(64, DenseScan(1, int8=True))
    mask = np.ones(len(vectors), dtype=bool)
    for _ in range(20):
        query = rng.standard_normal(64).astype(np.float32)
        query /= np.linalg.norm(query)
        found = first.top(vectors, len(vectors), query, mask, 50)
        assert found is not None
        slots, scores = found
        exact = vectors @ query
        best = set(np.argsort(-exact)[:50].tolist())
        assert best <= set(slots.tolist())
        assert 50 <= slots.size < len(vectors) // 4
        np.testing.assert_allclose(scores, exact[slots], rtol=1e-5, atol=1e-6)
