"""The semantic cache of rag.search_docs over the in-process gateway (fakes, a SQLite state
database for the index generations, the in-memory store): hits for repeats and near
duplicates, never across scopes, gone after any write to the team."""

from __future__ import annotations

import asyncio
import time

import pytest

from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
QUERY = {"team_id": "dao_a", "query": "Milvus gateway search notes deploy", "top_k": 5}


def headers(team: str = "dao_a", roles: tuple[str, ...] = ("member",), **extra) -> dict:
    return {"authorization": f"Bearer {mint(claims(teams={team: list(roles)}, **extra))}"}


@pytest.fixture
def make(tmp_path):
    def make(**cache):
        return build_gateway(
            corpus=tenancy_corpus(),
            policy=TENANCY_POLICY,
            state_url=f"sqlite:///{tmp_path / 'state.db'}",
            cache={"similarity": 0.8, **cache},
        )

    return make


def search(gw, body=QUERY, hdrs=None):
    r = gw.client.post("/rag/search_docs", json=body, headers=hdrs or headers())
    assert r.status_code == 200, r.text
    return r.json()


def test_a_repeat_is_served_from_the_cache_with_the_same_matches(make):
    gw = make()
    first, second = search(gw), search(gw)
    assert first["cache"] == {"hit": False, "status": "miss", "backend": "memory"}
    assert second["cache"]["hit"] and second["cache"]["similarity"] == 1.0
    assert second["matches"] == first["matches"] and second["trace_id"] != first["trace_id"]
    # Case and spacing do not make another query.
    third = search(gw, QUERY | {"query": "  MILVUS gateway   search notes deploy "})
    assert third["cache"]["hit"] and third["cache"]["similarity"] == 1.0
    # One generation read per lookup here (one at a time: nothing to share).
    status = asyncio.run(gw.service.cache.status())
    assert status["generation_reads"] == 3 and status["generation_reads_shared"] == 0


def test_a_near_duplicate_hits_and_an_unrelated_query_misses(make):
    gw = make()
    search(gw)
    near = search(gw, QUERY | {"query": "Milvus gateway search notes deploy please"})
    assert near["cache"]["hit"] and 0.8 <= near["cache"]["similarity"] < 1.0
    # Its wording is remembered: a repeat is an exact hit, with no query embedding.
    embedded = len(gw.embedder.calls)
    again = search(gw, QUERY | {"query": "Milvus gateway search notes deploy please"})
    assert again["cache"]["similarity"] == 1.0 and len(gw.embedder.calls) == embedded
    other = search(gw, QUERY | {"query": "budget"})
    assert not other["cache"]["hit"]


def test_only_exact_repeats_hit_at_similarity_one(make):
    gw = make(similarity=1.0)
    search(gw)
    near = search(gw, QUERY | {"query": "Milvus gateway search notes deploy please"})
    assert not near["cache"]["hit"]


def test_callers_with_other_scopes_never_share_an_answer(make):
    gw = make()
    owner = headers(roles=("owner",))
    confidential = search(gw, QUERY | {"mode": "confidential", "top_k": 50}, owner)
    assert any("conf" in m["source_ref"]["id"] for m in confidential["matches"])
    # A member asking the same question publicly: a miss, and nothing confidential.
    public = search(gw, QUERY | {"top_k": 50})
    assert not public["cache"]["hit"]
    assert not any("conf" in m["source_ref"]["id"] for m in public["matches"])
    # Another group, another agent, another request shape: each its own bucket.
    assert not search(gw, QUERY | {"top_k": 50}, headers(groups=["ops"]))["cache"]["hit"]
    assert not search(gw, QUERY | {"top_k": 50}, headers(agent_id="ag_2"))["cache"]["hit"]
    assert not search(gw, QUERY | {"top_k": 4})["cache"]["hit"]
    assert not search(gw, QUERY | {"top_k": 50, "search_mode": "dense"})["cache"]["hit"]
    assert search(gw, QUERY | {"top_k": 50})["cache"]["hit"]


def test_an_ingest_into_the_team_invalidates_and_another_team_does_not(make):
    gw = make()
    search(gw)
    other = {
        "team_id": "dao_b",
        "doc_id": "new_b",
        "text": "Milvus gateway notes of team b",
        "visibility": "public",
    }
    r = gw.client.post(
        "/ingest/documents", json={"documents": [other]}, headers=headers("dao_b", ("owner",))
    )
    assert r.status_code == 200, r.text
    assert search(gw)["cache"]["hit"]
    mine = other | {"team_id": "dao_a", "doc_id": "new_a", "text": "Milvus gateway search deploy"}
    r = gw.client.post(
        "/ingest/documents", json={"documents": [mine]}, headers=headers(roles=("owner",))
    )
    assert r.status_code == 200, r.text
    after = search(gw)
    assert not after["cache"]["hit"]
    assert "new_a" in {m["source_ref"]["id"] for m in after["matches"]}


def test_a_delete_and_a_graph_upsert_invalidate(make):
    gw = make()
    search(gw)
    generations = gw.service.pipeline.generations
    before = generations.get("dao_a")
    import asyncio

    asyncio.run(gw.service.pipeline.delete([("dao_a", "doc", "dao_a_pub_doc")]))
    assert generations.get("dao_a") == before + 1
    assert not search(gw)["cache"]["hit"]
    r = gw.client.post(
        "/graph/entities",
        json={"team_id": "dao_a", "nodes": [{"label": "Project", "id": "p1", "name": "P"}]},
        headers=headers(roles=("owner",)),
    )
    assert r.status_code == 200, r.text
    assert generations.get("dao_a") == before + 2
    assert not search(gw)["cache"]["hit"]


def test_entries_expire_after_the_ttl(make):
    gw = make(ttl_s=0.2)
    search(gw)
    assert search(gw)["cache"]["hit"]
    time.sleep(0.3)
    assert not search(gw)["cache"]["hit"]


def test_degraded_answers_are_not_cached(make):
    gw = make()
    gw.embedder.down = True
    first = search(gw)
    assert first["degraded"] and not first["cache"]["hit"]
    gw.embedder.down = False
    assert not search(gw)["cache"]["hit"]


def test_an_unreachable_redis_skips_the_cache_and_still_answers(make):
    gw = make(backend="redis", redis_url="redis://127.0.0.1:1/0", redis_timeout_s=0.2)
    started = time.perf_counter()
    body = search(gw)
    assert body["cache"]["status"].startswith("unavailable") and not body["degraded"]
    assert body["matches"] and time.perf_counter() - started < 5
    # The next search skips the broken store at once instead of waiting for it again.
    started = time.perf_counter()
    again = search(gw)
    assert "retrying" in again["cache"]["status"] and time.perf_counter() - started < 0.15
    ready = gw.client.get("/readyz").json()
    assert ready["components"]["cache"]["ready"] is False and "cache" not in ready["not_ready"]


def test_without_a_state_database_there_is_no_cache():
    gw = build_gateway(corpus=tenancy_corpus(), policy=TENANCY_POLICY)
    assert gw.service.cache is None
    assert "cache" not in search(gw)


def test_the_lookups_embedding_is_the_searchs_whatever_type_the_embedder_returns(make):
    # The Serve embedder answers arrays, not lists: the vector the cache made for its
    # near-duplicate lookup must reach the graph-boosted search as the pipeline's own.
    gw = make()
    original = gw.embedder.embed

    async def as_tuples(texts, kind="passage"):
        return [tuple(v) for v in await original(texts, kind)]

    gw.embedder.embed = as_tuples
    node = {"labels": ["Resource"], "id": "milvus", "team_id": "dao_a", "visibility": "public"}
    gw.service.graph.results["related"] = {
        "entities": [{"node": node, "score": 1.0}],
        "docs": {"dao_a_pub_doc": 1.0},
    }
    body = search(gw, QUERY | {"graph": "boost", "search_mode": "dense"})
    assert body["matches"] and body["graph"]["applied"] and not body["cache"]["hit"]
    assert search(gw, QUERY | {"graph": "boost", "search_mode": "dense"})["cache"]["hit"]


def test_the_search_hands_the_generation_it_read_to_the_store(make):
    """The generation the cache read for this search reaches the store, which may take an
    unchanged one as "nothing written since its last check" (HotIndex.fresh)."""
    gw = make()
    store = gw.service.retrieval.store
    real, seen = store.candidates, []

    async def candidates(*args, **kwargs):
        seen.append(kwargs.get("generation"))
        return await real(*args, **kwargs)

    store.candidates = candidates
    search(gw)
    generation = gw.service.pipeline.generations.get("dao_a")
    assert seen and set(seen) == {generation}
    # A write raises it; the next search brings the new one.
    asyncio.run(gw.service.pipeline.delete([("dao_a", "doc", "dao_a_pub_doc")]))
    seen.clear()
    search(gw)
    assert set(seen) == {generation + 1}


def test_a_failed_generation_raise_is_tried_once_more_then_reported(make):
    """Searches take an unchanged generation as "nothing written": a raise that fails is
    tried again, and one that fails twice is reported to the writer."""
    gw = make()
    pipeline = gw.service.pipeline
    real, calls = pipeline.generations.bump, []

    def flaky(teams):
        calls.append(sorted(teams))
        if len(calls) == 1:
            raise RuntimeError("state database restarting")
        real(teams)

    before = pipeline.generations.get("dao_a")
    pipeline.generations.bump = flaky
    assert asyncio.run(pipeline.bump_generations({"dao_a"})) is None
    assert len(calls) == 2 and pipeline.generations.get("dao_a") == before + 1

    def down(teams):
        raise RuntimeError("state database down")

    pipeline.generations.bump = down
    assert asyncio.run(pipeline.bump_generations({"dao_a"})) == "state database down"
