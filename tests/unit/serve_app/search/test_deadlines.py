"""Every model call of a search has a deadline: an Embedder or Reranker replica that does not
answer makes the answer degraded within ``search.embed_deadline_s`` / ``rerank_deadline_s``
(BM25 only, or the fused order), instead of waiting for Serve to replace it (~10 s) or for
the proxy's 120 s timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

from deployments.testing.fakes import FakeReranker
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
HEADERS = {"authorization": f"Bearer {mint(claims(teams={'dao_a': ['member']}))}"}
QUERY = {"team_id": "dao_a", "query": "Milvus gateway search notes deploy"}


def hang(method):
    async def never(*args, **kwargs):
        await asyncio.sleep(30)
        return await method(*args, **kwargs)

    return never


def test_a_hung_embedder_degrades_the_search_to_bm25_within_the_deadline():
    gw = build_gateway(
        corpus=tenancy_corpus(), policy=TENANCY_POLICY, search={"embed_deadline_s": 0.3}
    )
    gw.embedder.embed = hang(gw.embedder.embed)
    started = time.perf_counter()
    r = gw.client.post("/rag/search_docs", json=QUERY, headers=HEADERS)
    took = time.perf_counter() - started
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["degraded"] and body["mode"] == "bm25" and body["matches"]
    assert "within 0.3 s" in body["degraded_reasons"][0]
    assert took < 2.0
    # rag.enrich_answer's claims too.
    started = time.perf_counter()
    r = gw.client.post(
        "/rag/enrich_answer",
        json={"team_id": "dao_a", "draft_answer": "Milvus gateway search notes deploy budget."},
        headers=HEADERS,
    )
    assert r.status_code == 200 and r.json()["degraded"] and time.perf_counter() - started < 2.0


def test_a_hung_reranker_keeps_the_fused_order_within_the_deadline():
    gw = build_gateway(
        corpus=tenancy_corpus(), policy=TENANCY_POLICY, search={"rerank_deadline_s": 0.3}
    )
    reranker = FakeReranker()
    reranker.rerank = hang(reranker.rerank)
    gw.services.retrieval.reranker = reranker
    started = time.perf_counter()
    r = gw.client.post("/rag/search_docs", json=QUERY | {"rerank": True}, headers=HEADERS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["degraded"] and body["matches"]
    assert any("reranker" in reason for reason in body["degraded_reasons"])
    assert time.perf_counter() - started < 2.0


def test_a_hung_graph_lets_a_graph_boosted_search_go_on_without_it():
    gw = build_gateway(
        corpus=tenancy_corpus(), policy=TENANCY_POLICY, search={"graph_deadline_s": 0.3}
    )
    gw.services.backends.graph.related_docs = hang(gw.services.backends.graph.related_docs)
    started = time.perf_counter()
    r = gw.client.post("/rag/search_docs", json=QUERY | {"graph": "boost"}, headers=HEADERS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["degraded"] and body["matches"] and body["graph"]["applied"] is False
    assert any("graph unavailable" in reason for reason in body["degraded_reasons"])
    assert time.perf_counter() - started < 2.0


def test_a_hung_retriever_is_a_503_naming_milvus_within_the_deadline():
    gw = build_gateway(
        corpus=tenancy_corpus(), policy=TENANCY_POLICY, search={"store_deadline_s": 0.3}
    )
    gw.store.candidates = hang(gw.store.candidates)
    started = time.perf_counter()
    r = gw.client.post("/rag/search_docs", json=QUERY, headers=HEADERS)
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "backend_unavailable" and "milvus" in r.json()["message"]
    assert time.perf_counter() - started < 2.0
