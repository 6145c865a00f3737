"""The fakes are only useful if they behave like the real backends; these tests pin that."""

from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.acl import tokens_key
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import (
    ChunkRecord,
    Embedder,
    GraphDocument,
    GraphStore,
    Reranker,
    SearchFilter,
    VectorStore,
)
from deployments.testing.fakes import (
    FakeEmbedder,
    FakeGraphStore,
    FakeReranker,
    FakeVectorStore,
    matches_filter,
)
from deployments.vector_store.filter import build_filter_expr

ROOT = Path(__file__).resolve().parents[4]


def chunk(chunk_id: str, **fields) -> ChunkRecord:
    values = {
        "doc_id": "d",
        "team_id": "t",
        "chunk_index": 0,
        "text": "milvus vectors",
        "title": "",
        "content_hash": "h",
        "embed_model": "m",
    }
    values.update(fields)
    return ChunkRecord(chunk_id=chunk_id, **values)


LIKE = re.compile(r'(\w+) like ("(?:[^"\\]|\\.)*")')


def like(value: str, pattern: str) -> bool:
    """Milvus ``like``: ``%`` any run, ``_`` one character."""
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, value, re.S) is not None


def eval_milvus_expr(expr: str, row: ChunkRecord) -> bool:
    """Evaluate the compiled Milvus expression on one row; JSON string literals are valid
    Python literals and the operators used are Python's too (``a like "p"`` becomes a call)."""
    expr = LIKE.sub(r"like(\1, \2)", expr)
    env = {
        "like": like,
        "acl_allow_key": tokens_key(row.acl_allow or ("*",), empty="*"),
        "acl_deny_key": tokens_key(row.acl_deny, empty=""),
        "array_contains_any": lambda values, wanted: bool(set(values) & set(wanted)),
        "array_contains_all": lambda values, wanted: set(wanted) <= set(values),
        "team_id": row.team_id,
        "doc_id": row.doc_id,
        "visibility": row.visibility,
        "project_id": row.project_id,
        "channel_id": row.channel_id,
        "agent_id": row.agent_id,
        "doc_type": row.doc_type,
        "tags": list(row.tags),
        "created_at": row.created_at,
        "acl_allow": list(row.acl_allow),
        "acl_deny": list(row.acl_deny),
    }
    return bool(eval(expr, {"__builtins__": {}}, env))


ROWS = [
    chunk(
        f"c{i}",
        team_id=team,
        visibility=visibility,
        project_id=project,
        channel_id=channel,
        doc_type=doc_type,
        tags=tags,
        created_at=created,
        acl_allow=allow,
        acl_deny=deny,
    )
    for i, (
        team,
        visibility,
        project,
        channel,
        doc_type,
        tags,
        created,
        (allow, deny),
    ) in enumerate(
        itertools.product(
            ["t", 't" or "1"=="1'],
            ["public", "confidential"],
            ["", "p"],
            ["", "ch"],
            ["doc", "wiki"],
            [(), ("a",), ("a", "b")],
            [0, 100],
            [
                (("*",), ()),
                (("*",), ("group:c",)),
                (("group:hr", "user:al"), ()),
                (("group:hr",), ("group:c",)),
            ],
        )
    )
]

FILTERS = [
    SearchFilter(team_id="t"),
    SearchFilter(team_id='t" or "1"=="1'),
    SearchFilter(team_id="t", visibilities=("public", "confidential")),
    SearchFilter(team_id="t", visibilities=("confidential",), project_id="p"),
    SearchFilter(team_id="t", project_id=""),
    SearchFilter(team_id="t", channel_id="ch", agent_id=""),
    SearchFilter(team_id="t", doc_types=("wiki",), tags_any=("b", "z")),
    SearchFilter(team_id="t", tags_any=("a",), created_from=1),
    SearchFilter(team_id="t", created_from=0, created_to=0),
    SearchFilter(team_id="t", created_to=100, doc_types=("doc", "wiki")),
    SearchFilter(team_id="t", acl_principals=("*", "user:al")),
    SearchFilter(team_id="t", acl_principals=("*", "group:hr")),
    SearchFilter(team_id="t", acl_principals=("*", "user:al", "group:c", "group:hr")),
    SearchFilter(team_id="t", acl_principals=("user:al",)),
]


@pytest.mark.parametrize("flt", FILTERS, ids=lambda f: build_filter_expr(f)[:60])
def test_fake_filter_agrees_with_the_compiled_milvus_expression(flt):
    expr = build_filter_expr(flt)
    for row in ROWS:
        assert matches_filter(row, flt) == eval_milvus_expr(expr, row), (expr, row)


def test_fakes_implement_the_protocols():
    assert isinstance(FakeEmbedder(), Embedder)
    assert isinstance(FakeReranker(), Reranker)
    assert isinstance(FakeVectorStore(), VectorStore)
    assert isinstance(FakeGraphStore(), GraphStore)


async def test_fake_embedder_gives_deterministic_unit_vectors_of_configured_dim():
    first = await FakeEmbedder(dim=8).embed(["Milvus search", "other"])
    second = await FakeEmbedder(dim=8).embed(["Milvus search", "other"])
    assert first == second
    assert all(len(v) == 8 for v in first)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0) for v in first)
    assert first[0] != first[1]


def test_fake_embedder_vectors_do_not_depend_on_python_hash_seed():
    code = (
        "from deployments.testing.fakes import FakeEmbedder; "
        "print(FakeEmbedder(4).vector('seeded text'))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(FakeEmbedder(4).vector("seeded text"))


async def test_fake_embedder_down_raises_backend_unavailable():
    embedder = FakeEmbedder()
    embedder.down = True
    with pytest.raises(BackendUnavailable, match="embedder"):
        await embedder.embed(["x"])
    assert (await embedder.status())["ready"] is False


async def test_fake_store_search_modes_rank_sensibly():
    embedder, store = FakeEmbedder(16), FakeVectorStore()
    texts = ["milvus vector search", "neo4j graph queries", "milvus cluster sizing"]
    vectors = await embedder.embed(texts)
    await store.upsert(
        [
            chunk(f"c{i}", text=t, vector=v)
            for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
        ]
    )
    query = "milvus vector search"
    [qv] = await embedder.embed([query], "query")
    flt = SearchFilter(team_id="t")
    dense = await store.search(query, qv, flt, 3, "dense")
    bm25 = await store.search(query, None, flt, 3, "bm25")
    hybrid = await store.search(query, qv, flt, 3, "hybrid")
    assert dense[0].chunk.chunk_id == "c0"
    assert [h.chunk.chunk_id for h in bm25] == ["c0", "c2"]  # c1 shares no term
    assert hybrid[0].chunk.chunk_id == "c0"
    assert hybrid[0].score == pytest.approx(2 / 61)
    assert all(h.chunk.vector == () for h in dense + bm25 + hybrid)
    assert len(await store.search(query, qv, flt, 1, "hybrid")) == 1


async def test_fake_store_rejects_what_milvus_store_rejects():
    store = FakeVectorStore()
    with pytest.raises(InvalidInput):
        await store.search("q", None, SearchFilter(team_id="t"), 5, "dense")
    with pytest.raises(InvalidInput):
        await store.search("q", None, SearchFilter(team_id="t"), 5, "fuzzy")
    with pytest.raises(InvalidInput):
        await store.search("q", None, SearchFilter(team_id=""), 5, "bm25")
    with pytest.raises(InvalidInput):
        await store.search("q", None, SearchFilter(team_id="t", project_id="a\nb"), 5, "bm25")


async def test_fake_store_fails_on_the_nth_upsert_only():
    store = FakeVectorStore(fail_on_upsert=2)
    await store.upsert([chunk("a")])
    with pytest.raises(BackendUnavailable):
        await store.upsert([chunk("b")])
    await store.upsert([chunk("c")])
    assert set(store.rows) == {"a", "c"}


async def test_fake_store_get_and_delete_stale_are_per_document():
    store = FakeVectorStore()
    await store.upsert(
        [
            chunk("a1", chunk_index=1, vector=[1.0]),
            chunk("a0", chunk_index=0, vector=[1.0]),
            chunk("b0", doc_id="other"),
            chunk("w0", doc_type="wiki"),
        ]
    )
    got = await store.get_chunks("t", "doc", "d")
    assert [c.chunk_id for c in got] == ["a0", "a1"]
    assert all(c.vector == () for c in got)
    assert await store.delete_stale_chunks("t", "doc", "d", ["a0"]) == 1
    assert set(store.rows) == {"a0", "b0", "w0"}
    assert await store.count("t") == 3
    assert await store.count("nobody") == 0


async def test_fake_store_and_graph_down_raise_backend_unavailable():
    store, graph = FakeVectorStore(), FakeGraphStore()
    store.down = graph.down = True
    with pytest.raises(BackendUnavailable, match="milvus"):
        await store.get_chunks("t", "doc", "d")
    with pytest.raises(BackendUnavailable, match="neo4j"):
        await graph.merge_documents([GraphDocument("t", "d", "T", "public", "doc")])
    assert (await store.status())["ready"] is False
    assert (await graph.status())["ready"] is False


async def test_fake_reranker_prefers_passages_sharing_query_words():
    scores = await FakeReranker().rerank("milvus vectors", ["cats", "milvus vectors here"])
    assert scores[1] > scores[0]
