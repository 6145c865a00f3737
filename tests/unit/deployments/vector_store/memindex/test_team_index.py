"""The in-memory team index (deployments.vector_store.memindex.team) against exact references:
brute-force cosine, BM25 computed from scratch over the live rows, and the compiled Milvus
expression evaluated row by row — through writes, deletes and repacks."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.protocols import ChunkRecord, SearchFilter
from deployments.vector_store.filter import compile_filter
from deployments.vector_store.memindex.team import TeamIndex
from tests.unit.deployments.testing.test_fakes import FILTERS, ROWS, eval_milvus_expr


def tokens(text: str) -> list[str]:
    """Milvus Lite's standard analyzer, the reference the index must match."""
    return re.findall(r"\w+", text.lower())


WORDS = [
    "milvus",
    "neo4j",
    "graph",
    "vector",
    "search",
    "tenant",
    "chunk",
    "agent",
    "ray",
    "serve",
    "bm25",
    "index",
]


def row(i: int, rng: random.Random, dim: int = 16, **fields) -> ChunkRecord:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
    vector = [rng.gauss(0, 1) for _ in range(dim)]
    values = {
        "chunk_id": f"c{i}",
        "doc_id": f"d{i % 7}",
        "team_id": "t",
        "chunk_index": i,
        "text": text,
        "title": "",
        "content_hash": "h",
        "embed_model": "m",
        "vector": vector,
    }
    values.update(fields)
    return ChunkRecord(**values)


def brute_dense(rows: dict[str, ChunkRecord], query: list[float]) -> list[tuple[str, float]]:
    q = np.asarray(query) / np.linalg.norm(query)
    scored = []
    for cid, r in rows.items():
        v = np.asarray(r.vector)
        scored.append((cid, float(v @ q / np.linalg.norm(v))))
    return sorted(scored, key=lambda s: -s[1])


def brute_bm25(
    rows: dict[str, ChunkRecord], query: str, k1: float = 1.5, b: float = 0.75
) -> dict[str, float]:
    docs = {cid: Counter(tokens(r.text)) for cid, r in rows.items()}
    n = len(docs)
    avgdl = sum(sum(c.values()) for c in docs.values()) / n
    out: dict[str, float] = {}
    for term, weight in Counter(tokens(query)).items():
        df = sum(1 for c in docs.values() if term in c)
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for cid, counts in docs.items():
            tf = counts.get(term, 0)
            if tf:
                dl = sum(counts.values())
                out[cid] = out.get(cid, 0.0) + weight * idf * tf * (k1 + 1) / (
                    tf + k1 * (1 - b + b * dl / avgdl)
                )
    return out


ALL = compile_filter(SearchFilter(team_id="t", visibilities=("public", "confidential")))


def churn(index: TeamIndex, rng: random.Random, n: int = 600) -> dict[str, ChunkRecord]:
    """Upserts, re-upserts with new text and deletes, enough to trigger repacks."""
    live: dict[str, ChunkRecord] = {}
    for step in range(n):
        i = rng.randrange(400)
        if rng.random() < 0.25 and live:
            victim = rng.choice(sorted(live))
            assert index.remove([victim]) == 1
            del live[victim]
        else:
            r = row(i, rng)
            index.upsert([r])
            live[r.chunk_id] = r
        if step % 97 == 0:
            batch = [row(400 + step + j, rng) for j in range(20)]
            index.upsert(batch)
            live.update({r.chunk_id: r for r in batch})
    return live


def test_dense_search_is_the_exact_cosine_ranking_through_churn():
    rng = random.Random(3)
    index = TeamIndex(dim=16)
    live = churn(index, rng)
    assert len(index) == len(live)
    for _ in range(20):
        query = [rng.gauss(0, 1) for _ in range(16)]
        hits = index.search("dense", ALL, 10, query_vector=query)
        expected = brute_dense(live, query)[:10]
        assert [h.chunk.chunk_id for h in hits] == [cid for cid, _ in expected]
        for hit, (_, score) in zip(hits, expected, strict=True):
            assert hit.score == pytest.approx(score, abs=1e-5)
            assert hit.scores == {"dense": hit.score}


def test_bm25_scores_equal_a_from_scratch_bm25_over_the_live_rows():
    rng = random.Random(5)
    index = TeamIndex(dim=16)
    live = churn(index, rng)
    for _ in range(20):
        query = " ".join(rng.sample(WORDS, 3)) + " unknownword"
        hits = index.search("bm25", ALL, 50, query_text=query)
        expected = brute_bm25(live, query)
        assert {h.chunk.chunk_id for h in hits} <= set(expected)
        assert len(hits) == min(50, len(expected))
        for hit in hits:
            assert hit.score == pytest.approx(expected[hit.chunk.chunk_id], rel=1e-4)
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert min(expected.values()) <= scores[-1] + 1e-6 or len(hits) == len(expected)


def test_a_query_with_no_known_term_finds_nothing():
    index = TeamIndex(dim=16)
    index.upsert([row(1, random.Random(1))])
    assert index.search("bm25", ALL, 10, query_text="zzz qqq") == []


def test_upsert_replaces_and_remove_forgets_a_chunk():
    rng = random.Random(7)
    index = TeamIndex(dim=16)
    first = row(1, rng, text="milvus vectors")
    index.upsert([first, row(2, rng, text="graph neo4j")])
    index.upsert([replace(first, text="ray serve")])
    assert len(index) == 2
    assert [h.chunk.text for h in index.search("bm25", ALL, 5, query_text="ray")] == ["ray serve"]
    assert index.search("bm25", ALL, 5, query_text="milvus") == []
    assert index.remove(["c1", "missing"]) == 1
    assert "c1" not in index
    assert [h.chunk.chunk_id for h in index.search("bm25", ALL, 5, query_text="graph")] == ["c2"]


def test_returned_chunks_carry_no_vector():
    index = TeamIndex(dim=16)
    index.upsert([row(1, random.Random(1))])
    (hit,) = index.search("dense", ALL, 1, query_vector=[1.0] * 16)
    assert tuple(hit.chunk.vector) == ()


@pytest.mark.parametrize("flt", FILTERS, ids=lambda f: compile_filter(f).expr[:60])
def test_filter_admits_exactly_the_rows_the_milvus_expression_admits(flt):
    index = TeamIndex(dim=16)
    rng = random.Random(11)
    rows = [replace(r, vector=[rng.gauss(0, 1) for _ in range(16)]) for r in ROWS]
    index.upsert(rows)
    compiled = compile_filter(flt)
    found = {
        h.chunk.chunk_id for h in index.search("dense", compiled, 10_000, query_vector=[1.0] * 16)
    }
    expected = {r.chunk_id for r in rows if eval_milvus_expr(compiled.expr, r)}
    assert found == expected
    # BM25 is restricted the same way ("milvus" is in every row's text).
    found = {h.chunk.chunk_id for h in index.search("bm25", compiled, 10_000, query_text="milvus")}
    assert found == expected


TEAMS = ["t", 't" or "1"=="1', "other", "t "]
TAGS = ["a", "b", "skill:x"]
ACL_GROUPS = ["group:hr", "group:ops", 'group:x" or "1"=="1']
ACL_ALLOWS = [("*",), ("*",), ("group:hr",), ("user:al",), ("group:ops", "user:bo")]


@st.composite
def chunks(draw) -> list[ChunkRecord]:
    n = draw(st.integers(1, 30))
    out = []
    for i in range(n):
        out.append(
            ChunkRecord(
                chunk_id=f"c{i}",
                doc_id=draw(st.sampled_from(["d1", "d2", "d3"])),
                team_id=draw(st.sampled_from(TEAMS)),
                chunk_index=i,
                text="milvus " + draw(st.sampled_from(["graph", "vector", "tenant"])),
                title="",
                content_hash="h",
                embed_model="m",
                visibility=draw(st.sampled_from(["public", "confidential"])),
                doc_type=draw(st.sampled_from(["doc", "wiki", "message"])),
                project_id=draw(st.sampled_from(["", "p", "q"])),
                channel_id=draw(st.sampled_from(["", "ch"])),
                agent_id=draw(st.sampled_from(["", "ag"])),
                tags=tuple(draw(st.lists(st.sampled_from(TAGS), max_size=3, unique=True))),
                created_at=draw(st.integers(0, 10)),
                acl_allow=draw(st.sampled_from(ACL_ALLOWS)),
                acl_deny=tuple(
                    draw(st.lists(st.sampled_from(ACL_GROUPS), max_size=2, unique=True))
                ),
                vector=[1.0, float(i), 0.5],
            )
        )
    return out


@st.composite
def filters(draw) -> SearchFilter:
    maybe = lambda values: draw(st.one_of(st.none(), st.sampled_from(values)))  # noqa: E731
    return SearchFilter(
        team_id=draw(st.sampled_from(TEAMS)),
        visibilities=tuple(
            draw(st.lists(st.sampled_from(["public", "confidential"]), min_size=1, unique=True))
        ),
        project_id=maybe(["", "p", "zz"]),
        channel_id=maybe(["", "ch"]),
        agent_id=maybe(["", "ag"]),
        doc_types=tuple(draw(st.lists(st.sampled_from(["doc", "wiki", "rwa"]), unique=True))),
        tags_any=tuple(draw(st.lists(st.sampled_from([*TAGS, "none"]), max_size=2, unique=True))),
        tags_all=tuple(draw(st.lists(st.sampled_from(TAGS), max_size=2, unique=True))),
        created_from=maybe([0, 3, 7]),
        created_to=maybe([2, 5, 10]),
        doc_ids=tuple(draw(st.lists(st.sampled_from(["d1", "d3", "d9"]), max_size=2, unique=True))),
        acl_principals=(
            "*",
            *draw(st.lists(st.sampled_from(["user:al", "user:bo"]), max_size=1)),
            *draw(st.lists(st.sampled_from(ACL_GROUPS), max_size=2, unique=True)),
        ),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=chunks(), flt=filters(), deleted=st.sets(st.integers(0, 29), max_size=5))
def test_property_search_never_returns_a_row_outside_the_compiled_filter(rows, flt, deleted):
    """Whatever the rows (several teams, one named like an injection), the filter and the
    deletes, a search returns exactly the live rows the Milvus expression admits."""
    index = TeamIndex(dim=3)
    index.upsert(rows)
    index.remove(f"c{i}" for i in deleted)
    compiled = compile_filter(flt)
    live = [r for r in rows if int(r.chunk_id[1:]) not in deleted]
    expected = {r.chunk_id for r in live if eval_milvus_expr(compiled.expr, r)}
    for method, kwargs in (
        ("dense", {"query_vector": [1.0, 0.0, 0.0]}),
        ("bm25", {"query_text": "milvus"}),
    ):
        found = index.search(method, compiled, 1000, **kwargs)
        assert {h.chunk.chunk_id for h in found} == expected
        assert all(h.chunk.team_id == flt.team_id for h in found)


def test_acl_masks_follow_upserts_removes_and_repacks():
    index = TeamIndex(dim=3)
    base = dict(team_id="t", chunk_index=0, title="", content_hash="h", embed_model="m")
    rows = [
        ChunkRecord(
            chunk_id=f"c{i}",
            doc_id=f"d{i}",
            text="milvus acl",
            vector=[1.0, i, 0.0],
            acl_allow=("group:hr",) if i % 2 else ("*",),
            **base,
        )  # fmt: skip
        for i in range(600)
    ]
    index.upsert(rows)
    hr = compile_filter(SearchFilter(team_id="t", acl_principals=("*", "group:hr")))
    nobody = compile_filter(SearchFilter(team_id="t"))
    assert len(index.search("bm25", hr, 10_000, query_text="milvus")) == 600
    assert len(index.search("bm25", nobody, 10_000, query_text="milvus")) == 300
    # Re-permission every open row to hr only, drop most rows (repacks), check again.
    index.upsert(replace(r, acl_allow=("group:hr",)) for r in rows if not int(r.chunk_id[1:]) % 2)
    index.remove(f"c{i}" for i in range(400))
    assert len(index.search("bm25", nobody, 10_000, query_text="milvus")) == 0
    assert len(index.search("bm25", hr, 10_000, query_text="milvus")) == 200


def test_memory_estimate_follows_the_rows():
    rng = random.Random(2)
    index = TeamIndex(dim=64)
    empty = index.nbytes
    index.upsert([row(i, rng, dim=64) for i in range(500)])
    full = index.nbytes
    assert full > empty + 500 * 64 * 4
    index.remove(f"c{i}" for i in range(400))  # repacks: the dead slots are given back
    assert index.nbytes < full
