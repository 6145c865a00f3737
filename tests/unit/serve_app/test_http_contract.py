"""The HTTP contract of the gateway, over the composed Services with in-memory fakes (no Ray)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from batch_ingest.chunking import TokenCounter, tokenizer_counter
from deployments.models.embedding import default_model_path
from deployments.protocols import Backends
from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeReranker, FakeVectorStore
from serve_app.asgi import create_app
from serve_app.composition import build_services
from serve_app.settings import GatewaySettings

TEAM = "dao_greenfood"
OTHER_TEAM = "dao_other"

# The request example of rag.search_docs in the task spec, verbatim.
SPEC_EXAMPLE = {
    "agent_id": "ag_daarwizz",
    "team_id": "dao_greenfood",
    "query": "які проєкти у нас вже використовують Milvus?",
    "top_k": 5,
    "filters": {"project_id": "prj_x", "doc_type": ["doc", "wiki"], "visibility": "public"},
}

CORPUS: list[dict[str, Any]] = [
    {
        "team_id": TEAM,
        "doc_id": "doc_123",
        "title": "Spec microdao RAG stack",
        "url": "https://docs.example.org/doc_123",
        "project_id": "prj_x",
        "doc_type": "doc",
        "tags": ["rag", "milvus"],
        "created_at": "2025-03-01T10:00:00Z",
        "text": "Проєкти GreenFood та EnergyUnion вже використовують Milvus для гібридного "
        "пошуку. Graph data lives in Neo4j.",
    },
    {
        "team_id": TEAM,
        "id": "wiki_milvus",
        "title": "Vector search wiki",
        "url": "https://wiki.example.org/milvus",
        "project_id": "prj_x",
        "doc_type": "wiki",
        "created_at": "2025-04-01T10:00:00Z",
        "text": "# Milvus\n\nMilvus is the vector store; these проєкти use it for search.",
    },
    {
        "team_id": TEAM,
        "doc_id": "msg_1",
        "project_id": "prj_x",
        "doc_type": "message",
        "channel_id": "tg_general",
        "created_at": "2025-05-01T10:00:00Z",
        "text": "Хто ще використовує Milvus у проєкті? Які проєкти?",
    },
    {
        "team_id": TEAM,
        "doc_id": "doc_prj_y",
        "project_id": "prj_y",
        "doc_type": "doc",
        "text": "Проєкти команди Y також використовують Milvus.",
    },
    {
        "team_id": TEAM,
        "doc_id": "doc_secret",
        "project_id": "prj_x",
        "doc_type": "doc",
        "mode": "confidential",
        "text": "Конфіденційно: які проєкти платять за кластер Milvus.",
    },
    {
        "dao_id": OTHER_TEAM,
        "doc_id": "doc_other",
        "project_id": "prj_x",
        "doc_type": "doc",
        "text": "Проєкти іншої команди вже використовують Milvus.",
    },
]


@dataclass
class Gateway:
    client: TestClient
    settings: GatewaySettings
    embedder: FakeEmbedder
    store: FakeVectorStore
    graph: FakeGraphStore
    reranker: FakeReranker | None

    def search(self, body: dict[str, Any], **kwargs: Any) -> Any:
        return self.client.post("/rag/search_docs", json=body, **kwargs)

    def ingest(self, documents: list[dict[str, Any]]) -> Any:
        return self.client.post("/ingest/documents", json={"documents": documents})


@pytest.fixture(scope="module")
def count() -> TokenCounter:
    return tokenizer_counter(default_model_path())


@pytest.fixture
def make_gateway(count):
    def make(
        *,
        settings: dict[str, Any] | None = None,
        reranker: bool = False,
        store: FakeVectorStore | None = None,
        corpus: bool = True,
    ) -> Gateway:
        # The contract tests send no credentials: they run in dev mode (body trust), which
        # keeps them about the contract; tokens and policy are in test_auth_http.py.
        gateway_settings = GatewaySettings(
            environment="test", **({"auth": {"mode": "dev"}} | (settings or {}))
        )
        embedder, graph = FakeEmbedder(dim=32), FakeGraphStore()
        store = store or FakeVectorStore()
        fake_reranker = FakeReranker() if reranker else None
        backends = Backends(embedder=embedder, store=store, graph=graph, reranker=fake_reranker)
        services = build_services(gateway_settings, backends, count_tokens=count)
        client = TestClient(create_app(services), raise_server_exceptions=False)
        gateway = Gateway(client, gateway_settings, embedder, store, graph, fake_reranker)
        if corpus:
            response = gateway.ingest(CORPUS)
            assert response.status_code == 200, response.text
        return gateway

    return make


@pytest.fixture
def gateway(make_gateway) -> Gateway:
    return make_gateway()


def field_names(response) -> set[str]:
    return {item["field"] for item in response.json()["fields"]}


def ids(response) -> set[str]:
    return {m["source_ref"]["id"] for m in response.json()["matches"]}


# --- rag.search_docs: the contract -------------------------------------------------------


def test_a_search_says_where_its_time_went(gateway):
    # Server-Timing names every stage of a hybrid search (docs/operations.md), the result
    # filter among them, each in milliseconds.
    response = gateway.search(SPEC_EXAMPLE)
    assert response.status_code == 200, response.text
    stages = dict(
        part.strip().split(";dur=") for part in response.headers["server-timing"].split(",")
    )
    assert {"access", "embed", "visible", "fuse", "post", "snippets", "app"} <= set(stages)
    assert {"dense", "bm25"} <= set(stages) or "dense+bm25" in stages
    assert all(float(ms) >= 0 for ms in stages.values())


def test_spec_example_returns_matches_in_contract_shape(gateway):
    response = gateway.search(SPEC_EXAMPLE)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["degraded"] is False
    assert body["matches"]
    for match in body["matches"]:
        assert isinstance(match["score"], float)
        assert match["title"]
        assert match["snippet"]
        assert set(match["source_ref"]) == {
            "type",
            "id",
            "url",
            "team_id",
            "doc_type",
            "chunk_index",
        }
        assert match["source_ref"]["team_id"] == TEAM
        assert match["source_ref"]["type"] == match["source_ref"]["doc_type"]
        assert isinstance(match["source_ref"]["chunk_index"], int)
        assert "scores" not in match


def test_spec_example_applies_project_doc_type_and_visibility_filters(gateway):
    response = gateway.search(SPEC_EXAMPLE)
    assert ids(response) == {"doc_123", "wiki_milvus"}


def test_spec_example_match_carries_title_url_and_snippet_of_the_document(gateway):
    matches = {m["source_ref"]["id"]: m for m in gateway.search(SPEC_EXAMPLE).json()["matches"]}
    doc = matches["doc_123"]
    assert doc["title"] == "Spec microdao RAG stack"
    assert doc["source_ref"]["url"] == "https://docs.example.org/doc_123"
    assert doc["source_ref"]["doc_type"] == "doc"
    assert "використовують Milvus" in doc["snippet"]
    # The stored context header (title › heading) is not repeated in the snippet.
    assert not doc["snippet"].startswith("Spec microdao RAG stack")


def test_matches_are_ordered_by_score(gateway):
    scores = [
        m["score"] for m in gateway.search({"team_id": TEAM, "query": "Milvus"}).json()["matches"]
    ]
    assert scores == sorted(scores, reverse=True)


def test_top_k_limits_the_number_of_matches(gateway):
    response = gateway.search({"team_id": TEAM, "query": "Milvus", "top_k": 2})
    assert len(response.json()["matches"]) == 2


def test_response_puts_degraded_first_and_has_mode_and_trace_id(gateway):
    response = gateway.search(SPEC_EXAMPLE, headers={"x-trace-id": "trace-123"})
    body = response.json()
    assert list(body)[:2] == ["degraded", "degraded_reasons"]
    assert body["mode"] == "hybrid"
    assert body["trace_id"] == "trace-123"
    assert body["took_ms"] >= 0


@pytest.mark.parametrize("alias", ["dao_id", "microdao_id"])
def test_dao_id_is_accepted_as_team_id(gateway, alias):
    body = {k: v for k, v in SPEC_EXAMPLE.items() if k != "team_id"} | {alias: TEAM}
    response = gateway.search(body)
    assert response.status_code == 200, response.text
    assert ids(response) == {"doc_123", "wiki_milvus"}


def test_same_tenant_under_two_keys_is_accepted(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"dao_id": TEAM})
    assert response.status_code == 200


def test_conflicting_team_id_and_dao_id_rejected(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"dao_id": OTHER_TEAM})
    assert response.status_code == 422
    problems = " ".join(item["problem"] for item in response.json()["fields"])
    assert "team_id" in problems
    assert "dao_id" in problems


def test_explain_adds_per_method_scores(gateway):
    # The default fusion is adaptive (weighted scores, per-query weights; deployments/config.py);
    # RRF on request.
    assert gateway.settings.search.fusion == "adaptive"
    response = gateway.search(SPEC_EXAMPLE | {"explain": True})
    for match in response.json()["matches"]:
        assert match["scores"]["weighted"] == pytest.approx(match["score"], abs=1e-6)
        assert {"dense", "bm25"} & set(match["scores"])
    response = gateway.search(SPEC_EXAMPLE | {"explain": True, "fusion": "rrf"})
    for match in response.json()["matches"]:
        assert match["scores"]["rrf"] == pytest.approx(match["score"], abs=1e-6)


def test_weighted_fusion_selectable_per_request(gateway):
    body = SPEC_EXAMPLE | {
        "explain": True,
        "fusion": "weighted",
        "weights": {"dense": 1, "bm25": 0},
    }
    matches = gateway.search(body).json()["matches"]
    assert matches and all("weighted" in m["scores"] for m in matches)
    assert [m["score"] for m in matches] == sorted((m["score"] for m in matches), reverse=True)


def test_adaptive_fusion_selectable_per_request(gateway):
    body = SPEC_EXAMPLE | {"explain": True, "fusion": "adaptive"}
    matches = gateway.search(body).json()["matches"]
    assert matches and all("weighted" in m["scores"] for m in matches)
    assert [m["score"] for m in matches] == sorted((m["score"] for m in matches), reverse=True)


def test_unknown_weight_key_is_422(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"weights": {"dense": 1, "colbert": 1}})
    assert response.status_code == 422
    assert "weights.colbert" in field_names(response)


def test_token_budget_limits_returned_passages(gateway):
    everything = gateway.search(SPEC_EXAMPLE | {"top_k": 10}).json()["matches"]
    tight = gateway.search(SPEC_EXAMPLE | {"top_k": 10, "max_context_tokens": 1}).json()
    assert len(everything) > 0 and tight["matches"] == []


def test_min_score_drops_weak_matches(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"min_score": 10.0})
    assert response.json()["matches"] == []


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_search_mode_is_passed_to_the_store(gateway, mode):
    response = gateway.search(SPEC_EXAMPLE | {"search_mode": mode})
    assert response.json()["mode"] == mode
    # Hybrid asks the store for each single method and fuses in the ingress.
    expected = ["dense", "bm25"] if mode == "hybrid" else [mode]
    assert [s[3] for s in gateway.store.searches[-len(expected) :]] == expected


def test_duplicate_passages_return_their_text_once_and_cite_both_sources(make_gateway):
    gateway = make_gateway(corpus=False)
    same = "Milvus keeps vectors for the greenfood team."
    gateway.ingest(
        [
            {"team_id": TEAM, "doc_id": "copy_a", "title": "A", "text": same},
            {"team_id": TEAM, "doc_id": "copy_b", "title": "B", "text": same},
        ]
    )
    first, second = gateway.search({"team_id": TEAM, "query": "Milvus vectors"}).json()["matches"]
    assert {first["source_ref"]["id"], second["source_ref"]["id"]} == {"copy_a", "copy_b"}
    assert "Milvus" in first["snippet"] and "duplicate_of" not in first
    assert second["snippet"] == "" and second["duplicate_of"] == first["chunk_id"]


def test_title_falls_back_to_doc_id_without_title(gateway):
    response = gateway.search({"team_id": OTHER_TEAM, "query": "Milvus"})
    assert [m["title"] for m in response.json()["matches"]] == ["doc_other"]


# --- tenancy and visibility -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["hybrid", "dense", "bm25"])
def test_team_never_sees_another_teams_chunks(gateway, mode):
    for team, foreign in ((TEAM, OTHER_TEAM), (OTHER_TEAM, TEAM)):
        body = {"team_id": team, "query": "Milvus проєкти", "top_k": 50, "search_mode": mode}
        for visibility in ("public", "confidential"):
            matches = gateway.search(body | {"mode": visibility}).json()["matches"]
            assert matches
            assert {m["source_ref"]["team_id"] for m in matches} == {team}
            assert foreign not in {m["source_ref"]["team_id"] for m in matches}


@pytest.mark.parametrize("mode", ["hybrid", "dense", "bm25"])
def test_confidential_chunk_hidden_from_public_caller(gateway, mode):
    body = {"team_id": TEAM, "query": "Конфіденційно кластер Milvus", "top_k": 50}
    response = gateway.search(body | {"search_mode": mode})
    assert response.status_code == 200
    assert "doc_secret" not in ids(response)
    assert ids(response)


def test_confidential_caller_sees_confidential_and_public_chunks(gateway):
    body = {"team_id": TEAM, "query": "Конфіденційно кластер Milvus", "top_k": 50}
    found = ids(gateway.search(body | {"mode": "confidential"}))
    assert "doc_secret" in found
    assert "doc_123" in found
    assert "doc_other" not in found


def test_public_caller_asking_for_confidential_filter_gets_403(gateway):
    body = SPEC_EXAMPLE | {"filters": {"visibility": "confidential"}}
    response = gateway.search(body)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert response.json()["hint"]


def test_confidential_caller_can_filter_to_confidential_only(gateway):
    body = {"team_id": TEAM, "query": "Milvus", "top_k": 50, "mode": "confidential"}
    response = gateway.search(body | {"filters": {"visibility": "confidential"}})
    assert ids(response) == {"doc_secret"}


def test_injection_shaped_team_id_matches_nothing(gateway):
    body = {"team_id": 'dao_greenfood" or team_id != "', "query": "Milvus", "top_k": 50}
    response = gateway.search(body)
    assert response.status_code == 200
    assert response.json()["matches"] == []


def test_filters_by_channel_tags_and_created_range(gateway):
    base = {"team_id": TEAM, "query": "Milvus проєкти", "top_k": 50}
    assert ids(gateway.search(base | {"filters": {"channel_id": "tg_general"}})) == {"msg_1"}
    assert ids(gateway.search(base | {"filters": {"tags": ["milvus", "absent"]}})) == {"doc_123"}
    in_april = {"created_from": "2025-04-01T00:00:00Z", "created_to": "2025-04-30T00:00:00Z"}
    assert ids(gateway.search(base | {"filters": in_april})) == {"wiki_milvus"}


# --- validation: 422 with the offending field -------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"query": None}, "query"),
        ({"query": ""}, "query"),
        ({"query": "   \n\t "}, "query"),
        ({"query": "x" * 2001}, "query"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 10**6}, "top_k"),
        ({"top_k": "abc"}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"team_id": None}, "team_id"),
        ({"team_id": ""}, "team_id"),
        ({"team_id": "dao\x00x"}, "team_id"),
        ({"filters": {"project_id": "prj_x", "projectid": "typo"}}, "filters.projectid"),
        ({"filters": {"visibility": "secret"}}, "filters.visibility"),
        ({"visibility": "secret"}, "visibility"),
        ({"mode": "everything"}, "mode"),
        ({"filters": {"created_from": 10, "created_to": 5}}, "filters"),
        ({"filters": {"created_from": "last week"}}, "filters.created_from"),
        ({"filters": {"tags": ["ok", "bad\nline"]}}, "filters.tags.1"),
        ({"filters": {"doc_type": [""]}}, "filters.doc_type.0"),
        ({"filters": "prj_x"}, "filters"),
        ({"search_mode": "semantic"}, "search_mode"),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_invalid_search_request_gives_422_naming_the_field(gateway, change, field):
    body = {k: v for k, v in (SPEC_EXAMPLE | change).items() if v is not None}
    response = gateway.search(body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert field in field_names(response)
    assert field in response.json()["message"]


def test_missing_query_named_in_fields(gateway):
    response = gateway.search({"team_id": TEAM})
    assert response.status_code == 422
    assert field_names(response) == {"query"}


@pytest.mark.parametrize(
    "content", ['{"team_id": "dao_greenfood", "query": ', "not json", '{"query": "a",}']
)
def test_malformed_json_gives_422(gateway, content):
    response = gateway.client.post(
        "/rag/search_docs", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "invalid_input"
    assert [item["field"] for item in body["fields"]] == ["body"]
    assert body["fields"][0]["problem"].startswith("malformed JSON at character")


def test_json_array_body_gives_422(gateway):
    response = gateway.search([SPEC_EXAMPLE])
    assert response.status_code == 422
    assert field_names(response) == {"body"}


def test_top_k_above_configured_max_but_within_schema_gives_422(gateway):
    assert gateway.settings.search.max_top_k == 50
    response = gateway.search(SPEC_EXAMPLE | {"top_k": 51})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "invalid_input"
    assert "top_k" in body["message"]
    assert "50" in body["message"]


def test_top_k_at_configured_max_is_accepted(gateway):
    assert gateway.search(SPEC_EXAMPLE | {"top_k": 50}).status_code == 200


def test_configured_max_top_k_applies(make_gateway):
    gateway = make_gateway(settings={"search": {"max_top_k": 3}})
    assert gateway.search(SPEC_EXAMPLE | {"top_k": 3}).status_code == 200
    assert gateway.search(SPEC_EXAMPLE | {"top_k": 4}).status_code == 422


def test_configured_default_top_k_applies_when_top_k_is_omitted(make_gateway):
    gateway = make_gateway(settings={"search": {"default_top_k": 2}})
    response = gateway.search({"team_id": TEAM, "query": "Milvus проєкти"})
    assert len(response.json()["matches"]) == 2


def test_configured_max_query_chars_applies(make_gateway):
    gateway = make_gateway(settings={"search": {"max_query_chars": 10}})
    response = gateway.search({"team_id": TEAM, "query": "Milvus проєкти"})
    assert response.status_code == 422


def test_misspelled_top_level_key_is_422_not_a_wider_search(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"filter": {"project_id": "prj_x"}})
    assert response.status_code == 422
    assert field_names(response) == {"filter"}


def test_infinite_created_from_gives_422(gateway):
    response = gateway.client.post(
        "/rag/search_docs",
        content='{"team_id": "dao_greenfood", "query": "q", "filters": {"created_from": Infinity}}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422


# --- degradation and outages ------------------------------------------------------------


def test_embedder_down_falls_back_to_bm25_and_says_so_first(gateway):
    gateway.embedder.down = True
    response = gateway.search(SPEC_EXAMPLE)
    assert response.status_code == 200
    body = response.json()
    assert list(body)[0] == "degraded"
    assert body["degraded"] is True
    assert body["degraded_reasons"][0].startswith("embedder unavailable")
    assert body["mode"] == "bm25"
    assert gateway.store.searches[-1][3] == "bm25"
    assert ids(response) == {"doc_123", "wiki_milvus"}


@pytest.mark.parametrize("memory_index", [True, False])
def test_hybrid_search_calls_the_store_once_with_the_memory_index_else_bm25_meanwhile(
    make_gateway, memory_index
):
    gateway = make_gateway(settings={"milvus": {"memory_index": {"enabled": memory_index}}})
    calls: list[tuple[tuple[str, ...], str]] = []
    candidates = gateway.store.candidates

    async def counting(query, vector, flt, limit, methods, read_id=""):
        calls.append((methods, read_id))
        return await candidates(query, vector, flt, limit, methods, read_id)

    gateway.store.candidates = counting
    response = gateway.search(SPEC_EXAMPLE)
    assert response.status_code == 200
    if memory_index:
        assert [m for m, _ in calls] == [("dense", "bm25")]
    else:
        assert sorted(m for m, _ in calls) == [("bm25",), ("dense",)]
    # One read id for the whole search, a fresh one for the next.
    assert len({r for _, r in calls}) == 1 and calls[0][1]
    gateway.search(SPEC_EXAMPLE)
    assert calls[-1][1] != calls[0][1]


def test_embedder_down_does_not_matter_for_bm25_requests(gateway):
    gateway.embedder.down = True
    body = gateway.search(SPEC_EXAMPLE | {"search_mode": "bm25"}).json()
    assert body["degraded"] is False


def test_store_down_gives_503_with_error_and_message(gateway):
    gateway.store.down = True
    response = gateway.search(SPEC_EXAMPLE)
    assert response.status_code == 503
    body = response.json()
    assert body["error"] == "backend_unavailable"
    assert body["message"].startswith("milvus:")
    assert body["trace_id"]


# --- reranker -----------------------------------------------------------------------------


def test_reranker_reorders_matches_and_explains_its_score(make_gateway):
    gateway = make_gateway(reranker=True)
    response = gateway.search(SPEC_EXAMPLE | {"explain": True})
    matches = response.json()["matches"]
    assert matches
    assert all("rerank" in m["scores"] and "weighted" in m["scores"] for m in matches)
    assert [m["score"] for m in matches] == sorted((m["score"] for m in matches), reverse=True)
    assert gateway.store.searches[-1][2] == gateway.settings.reranker.candidates
    # The reranker reads chunk bodies without the stored title header.
    assert not any(text.startswith("Spec microdao") for text in gateway.reranker.calls[-1][1])


def test_rerank_false_skips_the_reranker(make_gateway):
    gateway = make_gateway(reranker=True)
    gateway.search(SPEC_EXAMPLE | {"rerank": False})
    assert gateway.reranker.calls == []


def test_reranker_down_keeps_fused_order_and_reports_degraded(make_gateway):
    gateway = make_gateway(reranker=True)
    gateway.reranker.down = True
    response = gateway.search(SPEC_EXAMPLE)
    assert response.status_code == 200
    body = response.json()
    assert body["degraded"] is True
    assert body["degraded_reasons"][0].startswith("reranker unavailable")
    assert ids(response) == {"doc_123", "wiki_milvus"}


def test_rerank_requested_without_reranker_is_reported(gateway):
    body = gateway.search(SPEC_EXAMPLE | {"rerank": True}).json()
    assert body["degraded"] is True
    assert "no reranker" in body["degraded_reasons"][0]


# --- POST /ingest/documents ---------------------------------------------------------------


def test_ingest_indexes_documents_and_reports_each(make_gateway):
    gateway = make_gateway(corpus=False)
    response = gateway.ingest(CORPUS)
    assert response.status_code == 200
    body = response.json()
    assert (body["indexed"], body["unchanged"], body["failed"]) == (len(CORPUS), 0, 0)
    assert body["degraded"] is False
    assert [d["doc_id"] for d in body["documents"]] == [
        "doc_123",
        "wiki_milvus",
        "msg_1",
        "doc_prj_y",
        "doc_secret",
        "doc_other",
    ]
    assert all(
        d["status"] == "indexed" and d["graph"] and d["chunks"] >= 1 for d in body["documents"]
    )
    assert {c.team_id for c in gateway.store.rows.values()} == {TEAM, OTHER_TEAM}


def test_reingest_reports_unchanged(gateway):
    body = gateway.ingest(CORPUS).json()
    assert (body["indexed"], body["unchanged"]) == (0, len(CORPUS))


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"documents": []}, "documents"),
        ({}, "documents"),
        ({"documents": [{"team_id": TEAM, "doc_id": "d"}]}, "documents.0.text"),
        ({"documents": [{"team_id": TEAM, "doc_id": "d", "text": " "}]}, "documents.0.text"),
        (
            {"documents": [{"team_id": TEAM, "doc_id": "d", "text": "x", "colour": "green"}]},
            "documents.0.colour",
        ),
        ({"documents": [{"doc_id": "d", "text": "x"}]}, "documents.0.team_id"),
        (
            {"documents": [{"team_id": TEAM, "doc_id": "d", "text": "x", "doc_type": "Doc"}]},
            "documents.0.doc_type",
        ),
        ({"documents": [{"team_id": TEAM, "doc_id": "d", "text": "x"}], "x": 1}, "x"),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_invalid_ingest_request_gives_422_naming_the_field(gateway, payload, field):
    response = gateway.client.post("/ingest/documents", json=payload)
    assert response.status_code == 422, response.text
    assert field in field_names(response)


def test_first_ingest_of_heading_only_document_is_not_reported_unchanged(make_gateway):
    gateway = make_gateway(corpus=False)
    body = gateway.ingest([{"team_id": TEAM, "doc_id": "stub", "text": "# Roadmap 2026"}]).json()
    assert body["documents"][0]["status"] != "unchanged"


def test_too_many_documents_rejected_with_hint(make_gateway):
    gateway = make_gateway(settings={"ingest": {"max_documents": 2}}, corpus=False)
    response = gateway.ingest(CORPUS[:3])
    assert response.status_code == 422
    assert "at most 2" in response.json()["message"]
    assert response.json()["hint"]
    assert gateway.store.rows == {}


def test_too_long_document_rejected(make_gateway):
    gateway = make_gateway(settings={"ingest": {"max_document_chars": 20}}, corpus=False)
    response = gateway.ingest([{"team_id": TEAM, "doc_id": "d", "text": "x" * 21}])
    assert response.status_code == 422
    assert response.json()["message"].startswith("documents.0.text")


def test_ingest_with_graph_down_indexes_and_reports_degraded(make_gateway):
    gateway = make_gateway(corpus=False)
    gateway.graph.down = True
    body = gateway.ingest(CORPUS[:2]).json()
    assert body["indexed"] == 2
    assert body["degraded"] is True
    assert body["degraded_reasons"][0].startswith("graph not updated")
    assert ids(gateway.search(SPEC_EXAMPLE)) == {"doc_123", "wiki_milvus"}


def test_ingest_failure_of_one_document_is_reported_per_document(make_gateway):
    gateway = make_gateway(store=FakeVectorStore(fail_on_upsert=2), corpus=False)
    response = gateway.ingest(CORPUS[:3])
    assert response.status_code == 200
    body = response.json()
    assert (body["indexed"], body["failed"]) == (2, 1)
    assert body["degraded"] is True
    assert body["documents"][1]["status"] == "failed"
    assert any(reason.startswith("wiki_milvus:") for reason in body["degraded_reasons"])


@pytest.mark.parametrize("backend", ["store", "embedder"])
def test_ingest_with_backend_down_gives_503(make_gateway, backend):
    gateway = make_gateway(corpus=False)
    getattr(gateway, backend).down = True
    response = gateway.ingest(CORPUS[:1])
    assert response.status_code == 503
    assert response.json()["error"] == "backend_unavailable"


# --- health ---------------------------------------------------------------------------


def test_healthz_answers_ok(gateway):
    response = gateway.client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_200_when_all_components_are_up(make_gateway):
    gateway = make_gateway(reranker=True, corpus=False)
    response = gateway.client.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["ready"] is True
    assert body["not_ready"] == []
    assert set(body["components"]) == {"embedder", "milvus", "neo4j", "reranker", "audit"}


@pytest.mark.parametrize(
    ("backend", "component"),
    [("embedder", "embedder"), ("store", "milvus"), ("graph", "neo4j"), ("reranker", "reranker")],
)
def test_readyz_is_503_naming_the_component_that_is_down(make_gateway, backend, component):
    gateway = make_gateway(reranker=True, corpus=False)
    getattr(gateway, backend).down = True
    response = gateway.client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert body["not_ready"] == [component]
    assert body["components"][component]["ready"] is False


def test_readyz_counts_a_status_call_that_raises_as_not_ready(gateway, monkeypatch):
    async def broken() -> dict:
        raise ConnectionError("socket closed")

    monkeypatch.setattr(gateway.graph, "status", broken)
    body = gateway.client.get("/readyz").json()
    assert body["not_ready"] == ["neo4j"]
    assert "ConnectionError" in body["components"]["neo4j"]["error"]


def item_for(response, field: str) -> dict:
    return next(item for item in response.json()["fields"] if item["field"] == field)


def test_unknown_filter_key_lists_the_filter_keys(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"filters": {"projectid": "typo"}})
    assert response.status_code == 422
    item = item_for(response, "filters.projectid")
    assert {"project_id", "channel_id", "agent_id", "doc_type", "tags"} <= set(item["allowed"])
    assert "project_id" in item["problem"]


def test_unknown_top_level_key_lists_the_request_keys(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"topk": 3})
    assert response.status_code == 422
    item = item_for(response, "topk")
    assert {"query", "top_k", "filters", "team_id", "dao_id"} <= set(item["allowed"])


def test_wrong_enum_value_lists_the_allowed_values(gateway):
    response = gateway.search(SPEC_EXAMPLE | {"filters": {"visibility": "secret"}})
    item = item_for(response, "filters.visibility")
    assert "public" in item["allowed"] and "confidential" in item["allowed"]
    response = gateway.search(SPEC_EXAMPLE | {"fusion": "borda"})
    item = item_for(response, "fusion")
    assert all(f"'{v}'" in item["allowed"] for v in ("rrf", "weighted", "adaptive"))


def test_unknown_key_inside_an_ingested_document_lists_document_keys(gateway):
    doc = {"team_id": "dao_x", "doc_id": "d1", "text": "hello", "colour": "red"}
    response = gateway.client.post("/ingest/documents", json={"documents": [doc]})
    assert response.status_code == 422, response.text
    item = item_for(response, "documents.0.colour")
    assert {"team_id", "doc_id", "text", "tags", "created_at"} <= set(item["allowed"])


def test_openapi_documents_the_error_shape_of_every_tool_route(gateway):
    spec = gateway.client.get("/openapi.json").json()
    search = spec["paths"]["/rag/search_docs"]["post"]["responses"]
    for status in ("401", "403", "422", "503"):
        ref = search[status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorBody"), (status, ref)
    assert {"error", "message", "fields", "trace_id"} <= set(
        spec["components"]["schemas"]["ErrorBody"]["properties"]
    )
    # Health probes answer their own shape.
    assert "403" not in spec["paths"]["/readyz"]["get"]["responses"]
