"""MilvusStore against the real Milvus Lite server (no mocks)."""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
import pytest

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import ChunkRecord, SearchFilter
from deployments.vector_store.baseline import search_by_mode
from deployments.vector_store.store import MilvusStore

pytestmark = pytest.mark.integration

ADVERSARIAL = [
    'x" or team_id != "',
    "x' or team_id != '",
    "x) or (1==1",
    'back\\slash" || true',
    "ünïcödé команда",
]


def vec(seed: str, dim: int = 384) -> list[float]:
    rng = np.random.default_rng(int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16))
    v = rng.standard_normal(dim)
    return list(v / np.linalg.norm(v))


def chunk(team: str, doc: str, i: int = 0, text: str = "", **meta) -> ChunkRecord:
    text = text or f"{team} {doc} chunk {i}"
    return ChunkRecord(
        chunk_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{team}|{doc}|{i}").hex,
        doc_id=doc,
        team_id=team,
        chunk_index=i,
        text=text,
        title=meta.pop("title", f"title {doc}"),
        content_hash=hashlib.sha256(text.encode()).hexdigest(),
        embed_model="test@v1",
        vector=vec(text),
        **meta,
    )


@pytest.fixture
def team() -> str:
    return f"team_{uuid.uuid4().hex[:8]}"


def ids(hits) -> set[str]:
    return {h.chunk.doc_id for h in hits}


def test_collection_start_is_idempotent(store: MilvusStore):
    store.conn.reset()  # a dropped connection: start() opens a new one
    store.start()
    store.start()
    assert store.ping()["ready"] is True


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_search_stays_inside_team_and_visibility(store: MilvusStore, team: str, mode: str):
    other = team + "_other"
    store.upsert(
        [
            chunk(team, "pub", text="milvus vector database in production"),
            chunk(
                team, "conf", text="milvus vector database secret plan", visibility="confidential"
            ),
            chunk(other, "foreign", text="milvus vector database of another team"),
        ]
    )
    query = "milvus vector database"
    flt = SearchFilter(team_id=team, visibilities=("public",))
    hits = search_by_mode(store, query, vec(query), flt, 10, mode)
    assert ids(hits) == {"pub"}
    wide = SearchFilter(team_id=team, visibilities=("public", "confidential"))
    assert ids(search_by_mode(store, query, vec(query), wide, 10, mode)) == {"pub", "conf"}


def test_every_filter_field_narrows(store: MilvusStore, team: str):
    store.upsert(
        [
            chunk(
                team,
                "a",
                project_id="p1",
                channel_id="c1",
                agent_id="g1",
                doc_type="wiki",
                tags=("energy", "solar"),
                created_at=1_000,
            ),
            chunk(
                team,
                "b",
                project_id="p2",
                channel_id="c2",
                agent_id="g2",
                doc_type="doc",
                tags=("food",),
                created_at=2_000,
            ),
        ]
    )
    q = "chunk"

    def only(**kw) -> set[str]:
        return ids(store.search(q, vec(q), SearchFilter(team_id=team, **kw), 10, "dense"))

    assert only(project_id="p1") == {"a"}
    assert only(channel_id="c2") == {"b"}
    assert only(agent_id="g1") == {"a"}
    assert only(doc_types=("doc",)) == {"b"}
    assert only(doc_types=("doc", "wiki")) == {"a", "b"}
    assert only(tags_any=("solar", "none")) == {"a"}
    assert only(tags_all=("energy", "solar")) == {"a"}
    assert only(tags_all=("energy", "food")) == set()
    assert only(created_from=1_500) == {"b"}
    assert only(created_to=1_500) == {"a"}
    assert only(created_from=1_500, created_to=1_400) == set()


@pytest.mark.parametrize("evil", ADVERSARIAL)
def test_adversarial_filter_values_match_exactly_and_never_widen(store: MilvusStore, evil: str):
    store.upsert([chunk(evil, "evil-doc", tags=(evil,)), chunk("victim_team", "victim-doc")])
    q = "chunk"
    hits = store.search(q, vec(q), SearchFilter(team_id=evil), 50, "dense")
    assert ids(hits) == {"evil-doc"}
    hits = store.search(
        q, vec(q), SearchFilter(team_id="victim_team", tags_any=(evil,)), 50, "dense"
    )
    assert hits == []


def test_control_characters_in_filter_values_are_rejected(store: MilvusStore):
    with pytest.raises(InvalidInput):
        store.search("q", vec("q"), SearchFilter(team_id="a\nb"), 5, "dense")


def test_stale_chunks_removed_and_count_exact(store: MilvusStore, team: str):
    store.upsert([chunk(team, "doc", i) for i in range(4)])
    assert store.count(team) == 4
    keep = [chunk(team, "doc", i).chunk_id for i in range(2)]
    removed = store.delete_stale_chunks(team, "doc", "doc", keep)
    assert removed == 2
    assert [c.chunk_index for c in store.get_chunks(team, "doc", "doc")] == [0, 1]
    # Upserting the same ids again never duplicates.
    store.upsert([chunk(team, "doc", i) for i in range(2)])
    assert store.count(team) == 2


def test_bm25_scores_are_positive_and_ranked(store: MilvusStore, team: str):
    store.upsert(
        [
            chunk(team, "hit", text="neo4j graph traversal with cypher"),
            chunk(team, "miss", text="weather report for tomorrow"),
        ]
    )
    hits = store.search("cypher graph", None, SearchFilter(team_id=team), 5, "bm25")
    assert [h.chunk.doc_id for h in hits] == ["hit"]
    assert hits[0].score > 0


def test_dimension_mismatch_is_refused(settings, store: MilvusStore, team: str):
    store.upsert([chunk(team, "doc")])
    other = MilvusStore(settings.milvus, dim=8)
    with pytest.raises(BackendUnavailable, match="384-d"):
        other.count(team)


def test_each_team_gets_its_own_aliased_collection(settings, store: MilvusStore, run_id: str):
    a, b = f"layout_a_{run_id}", f"Layout A/{run_id}'"
    store.upsert([chunk(a, "doc-a"), chunk(b, "doc-b")])
    name_a, name_b = store.collection_for(a), store.collection_for(b)
    assert name_a != name_b and name_a.startswith(store.collection + "__")
    aliases, physical = store.owned.names()
    assert {name_a, name_b} <= set(aliases)
    assert {name_a + "__v1", name_b + "__v1"} <= set(physical)
    # The rows of one team are physically absent from the other team's collection.
    rows = store.conn.call("q", "query", name_a, filter="", output_fields=["team_id"], limit=100)
    assert {r["team_id"] for r in rows} == {a}


def test_reads_of_an_unknown_team_create_nothing(store: MilvusStore, run_id: str):
    ghost = f"ghost_{run_id}"
    assert store.count(ghost) == 0
    assert store.search("q", vec("q"), SearchFilter(team_id=ghost), 5, "dense") == []
    assert store.lookup(ghost, ["x"]) == {}
    assert store.get_chunks(ghost, "doc", "d") == []
    assert store.collection_for(ghost) not in store.owned.names()[0]


def test_shared_layout_keeps_all_teams_in_one_collection(settings, run_id: str):
    shared = MilvusStore(
        settings.milvus.model_copy(
            update={"collection": f"it_shared_{run_id}", "layout": "shared"}
        ),
        dim=384,
    )
    try:
        shared.upsert([chunk("team_x", "dx"), chunk("team_y", "dy")])
        assert shared.collection_for("team_x") == shared.collection_for("team_y")
        q = "chunk"
        hits = shared.search(q, vec(q), SearchFilter(team_id="team_x"), 10, "dense")
        assert ids(hits) == {"dx"}
        assert shared.owned.names() == (
            [f"it_shared_{run_id}"],
            [f"it_shared_{run_id}__v1"],
        )
    finally:
        shared.drop()
        shared.close()


def test_unreachable_milvus_is_backend_unavailable():
    store = MilvusStore(MilvusSettings(uri="http://127.0.0.1:1", timeout_s=1), dim=4)
    with pytest.raises(BackendUnavailable) as info:
        store.start()
    assert info.value.backend == "milvus"


def test_dropped_connection_is_reestablished_transparently(store: MilvusStore, team: str):
    store.upsert([chunk(team, "doc")])
    store.conn.client.close()  # what an idle GOAWAY from the server amounts to
    assert store.count(team) == 1


def test_first_call_on_a_fresh_store_connects_by_itself(settings, team: str):
    fresh = MilvusStore(settings.milvus, dim=384)
    try:
        fresh.flush()
        assert fresh.count(team) == 0
    finally:
        fresh.close()


async def test_candidates_run_each_method_for_fusion(settings, store: MilvusStore, team: str):
    from deployments.vector_store.deployment import RetrieverDeployment

    store.upsert([chunk(team, "x", text="graph traversal in neo4j"), chunk(team, "y")])
    retriever = RetrieverDeployment(settings.milvus, 384)
    retriever.store = store
    q = "neo4j traversal"
    lists = await retriever.candidates(q, vec(q), SearchFilter(team_id=team), 5, ("dense", "bm25"))
    assert set(lists) == {"dense", "bm25"}
    assert [h.chunk.doc_id for h in lists["bm25"]] == ["x"]
    assert {h.chunk.doc_id for h in lists["dense"]} == {"x", "y"}
