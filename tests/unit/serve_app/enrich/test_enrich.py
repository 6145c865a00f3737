"""rag.enrich_answer: claim splitting, citation markers, the max_docs cap, unsupported claims,
tenancy and visibility, 403/422/503, degradation (in-process app over fakes, no Ray)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from serve_app.enrich.claims import extract_claims, insert_markers, split_sentences
from serve_app.testing import build_gateway, claims, jwt_auth, mint

pytestmark = pytest.mark.usefixtures("clean_gateway_env")

TEAM = "dao_greenfood"
OTHER = "dao_other"
MARKERS = re.compile(r"\[\d+\]")

CORPUS: list[dict[str, Any]] = [
    {
        "team_id": TEAM,
        "doc_id": "rag_spec",
        "title": "RAG spec",
        "url": "https://docs.example.org/rag_spec",
        "doc_type": "doc",
        "text": "The gateway stores document chunks in Milvus and keeps entity relations in Neo4j.",
    },
    {
        "team_id": TEAM,
        "doc_id": "milvus_setup",
        "title": "Milvus setup",
        "url": "https://wiki.example.org/milvus",
        "doc_type": "wiki",
        "text": "Milvus runs as a standalone server with HNSW indexes for hybrid search.",
    },
    {
        "team_id": TEAM,
        "doc_id": "energy_uk",
        "title": "Енергетика",
        "doc_type": "wiki",
        "text": "Сонячні панелі та акумулятори живлять мікрогрід громади.",
    },
    {
        "team_id": TEAM,
        "doc_id": "payroll",
        "title": "Payroll",
        "doc_type": "doc",
        "visibility": "confidential",
        "text": "The payroll budget of the core engineering team is 3.5 million hryvnias.",
    },
    {
        "team_id": OTHER,
        "doc_id": "other_ledger",
        "title": "Ledger migration",
        "doc_type": "doc",
        "text": "Team Other migrates the warehouse ledger to Postgres next spring.",
    },
]

SPEC_EXAMPLE = {
    "team_id": TEAM,
    "question": "Поясни коротко архітектуру RAG шару в нашому місті.",
    "draft_answer": "The gateway stores chunks in Milvus. Relations live in Neo4j.",
    "max_docs": 3,
}
NONSENSE = "Purple elephants dance on quantum keyboards."


@pytest.fixture
def gateway():
    gw = build_gateway(auth={"mode": "dev"}, corpus=CORPUS)
    yield gw
    gw.client.close()


def with_enrich_settings(**enrich: Any):
    gw = build_gateway(auth={"mode": "dev"}, corpus=CORPUS)
    settings = gw.services.settings
    gw.services.enrich.settings = settings.model_copy(
        update={"enrich": settings.enrich.model_copy(update=enrich)}
    )
    return gw


def enrich(gw, body: dict[str, Any], token: str | None = None, **headers: str):
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return gw.client.post("/rag/enrich_answer", json=body, headers=headers)


def ok(response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return response.json()


def cited_ids(body: dict[str, Any]) -> set[str]:
    return {s["id"] for s in body["sources"]}


# --- splitting -------------------------------------------------------------------------------


def texts(text: str) -> list[str]:
    found = split_sentences(text)
    for s in found:
        assert text[s.start : s.end] == s.text
    return [s.text for s in found]


def test_english_abbreviations_and_decimals_do_not_split():
    assert texts(
        "Milvus stores vectors, e.g. chunk embeddings, i.e. 384 floats. The budget is 3.5 "
        "million! Is Neo4j used? Mr. Smith and J. Doe said so. It ends etc. and goes on."
    ) == [
        "Milvus stores vectors, e.g. chunk embeddings, i.e. 384 floats.",
        "The budget is 3.5 million!",
        "Is Neo4j used?",
        "Mr. Smith and J. Doe said so.",
        "It ends etc. and goes on.",
    ]


def test_ukrainian_sentences_split_with_abbreviations_kept():
    assert texts(
        "Архітектура має три шари, напр. Milvus та Neo4j. Бюджет становить 3.5 млн грн. "
        "Див. документ з м. Київ. Т. Шевченко написав це… А далі ще речення!"
    ) == [
        "Архітектура має три шари, напр. Milvus та Neo4j.",
        "Бюджет становить 3.5 млн грн.",
        "Див. документ з м. Київ.",
        "Т. Шевченко написав це…",
        "А далі ще речення!",
    ]


def test_lines_list_markers_and_headings():
    draft = "## Architecture\n- Milvus keeps the vectors.\n- Neo4j keeps relations\n\n2. Third."
    assert texts(draft) == ["Milvus keeps the vectors.", "Neo4j keeps relations", "Third."]


def test_short_fragments_and_stop_words_are_not_claims():
    draft = "Yes. OK! Milvus keeps the vectors. It is what it is. Так."
    assert [c.text for c in extract_claims(draft, 12, 5)] == ["Milvus keeps the vectors."]


def test_markers_go_after_punctuation_or_after_a_space():
    text = "One claim here. Another (in brackets). Last one"
    marked = insert_markers(text, {15: [1], 38: [2, 3], len(text): [1]})
    assert marked == "One claim here.[1] Another (in brackets).[2][3] Last one [1]"


# --- the contract ----------------------------------------------------------------------------


def test_spec_example_returns_enriched_answer_and_sources(gateway):
    body = ok(enrich(gateway, SPEC_EXAMPLE, **{"x-trace-id": "t-1"}))
    assert list(body)[:2] == ["degraded", "degraded_reasons"]
    assert body["degraded"] is False
    assert body["trace_id"] == "t-1"
    assert body["sources"]
    source = body["sources"][0]
    assert {"id", "title", "url"} <= set(source)
    assert source == body["sources"][0] | {
        "id": "rag_spec",
        "title": "RAG spec",
        "url": "https://docs.example.org/rag_spec",
        "team_id": TEAM,
        "marker": 1,
    }
    assert "Milvus" in source["snippet"]
    assert 0 < source["score"] <= 1
    assert body["enriched_answer"] == (
        "The gateway stores chunks in Milvus.[1] Relations live in Neo4j.[1]"
    )
    assert [c["supported"] for c in body["claims"]] == [True, True]
    assert body["claims"][0]["source_ids"] == ["rag_spec"]
    assert body["claims"][0]["markers"] == [1]
    assert body["unsupported_claims"] == []


def test_answer_text_is_unchanged_apart_from_markers(gateway):
    draft = (
        "Intro line without support for anything here\n"
        "- The gateway stores chunks in Milvus.\n"
        "- Milvus runs HNSW indexes for hybrid search.\n\n"
        f"{NONSENSE}  Trailing text."
    )
    body = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": draft, "max_docs": 5}))
    answer = body["enriched_answer"]
    assert MARKERS.sub("", answer) == draft
    assert "- The gateway stores chunks in Milvus.[1]\n" in answer
    assert "- Milvus runs HNSW indexes for hybrid search.[2]\n" in answer
    assert [s["id"] for s in body["sources"]] == ["rag_spec", "milvus_setup"]
    assert [s["marker"] for s in body["sources"]] == [1, 2]
    for claim in body["claims"]:
        assert draft[claim["start"] : claim["end"]] == claim["text"]


def test_unsupported_claims_are_reported_and_not_marked(gateway):
    draft = f"The gateway stores chunks in Milvus. {NONSENSE}"
    body = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": draft}))
    assert body["unsupported_claims"] == [NONSENSE]
    nonsense = body["claims"][1]
    assert nonsense == nonsense | {
        "supported": False,
        "source_ids": [],
        "markers": [],
        "reason": "no_support",
    }
    assert body["enriched_answer"].endswith(NONSENSE)


def test_nothing_supported_gives_the_draft_back_unchanged(gateway):
    body = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": NONSENSE}))
    assert body["enriched_answer"] == NONSENSE
    assert body["sources"] == []
    assert body["unsupported_claims"] == [NONSENSE]


def test_max_docs_caps_distinct_sources(gateway):
    draft = (
        "The gateway stores chunks in Milvus. Milvus runs HNSW indexes for hybrid search. "
        "Сонячні панелі живлять мікрогрід громади."
    )
    body = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": draft, "max_docs": 3}))
    assert cited_ids(body) == {"rag_spec", "milvus_setup", "energy_uk"}
    body = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": draft, "max_docs": 1}))
    assert len(body["sources"]) == 1
    assert len(set(MARKERS.findall(body["enriched_answer"]))) == 1
    reasons = [c.get("reason") for c in body["claims"] if not c["supported"]]
    assert reasons and set(reasons) == {"over_max_docs"}
    assert len(body["unsupported_claims"]) == len(reasons)


def test_default_max_docs_is_three(gateway):
    request = {k: v for k, v in SPEC_EXAMPLE.items() if k != "max_docs"}
    assert ok(enrich(gateway, request))["sources"]


def test_ukrainian_claim_is_supported_by_inflected_forms(gateway):
    draft = "Мікрогрід громади живиться від сонячних панелей та акумуляторів."
    body = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": draft}))
    assert cited_ids(body) == {"energy_uk"}
    assert body["enriched_answer"] == draft + "[1]"


def test_all_claims_are_embedded_in_one_call(gateway):
    gateway.embedder.calls.clear()
    ok(enrich(gateway, {"team_id": TEAM, "draft_answer": f"{SPEC_EXAMPLE['draft_answer']} X."}))
    assert gateway.embedder.calls == [
        (["The gateway stores chunks in Milvus.", "Relations live in Neo4j."], "query")
    ]


def test_claims_beyond_the_limit_are_skipped(clean_gateway_env):
    gw = with_enrich_settings(max_claims=1)
    body = ok(enrich(gw, SPEC_EXAMPLE))
    assert len(body["claims"]) == 1
    assert body["skipped_claims"] == 1
    assert body["enriched_answer"].endswith("Relations live in Neo4j.")


@pytest.mark.parametrize("alias", ["dao_id", "microdao_id"])
def test_team_aliases(gateway, alias):
    request = {k: v for k, v in SPEC_EXAMPLE.items() if k != "team_id"} | {alias: TEAM}
    assert ok(enrich(gateway, request))["sources"]


# --- tenancy and visibility ----------------------------------------------------------------


def test_other_teams_documents_are_never_cited(gateway):
    draft = "Team Other migrates the warehouse ledger to Postgres next spring."
    for mode in ("public", "confidential"):
        body = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": draft, "mode": mode}))
        assert body["sources"] == []
        assert body["unsupported_claims"] == [draft]
        assert "ledger" not in str(body["sources"])
    # The owning team gets it cited.
    body = ok(enrich(gateway, {"team_id": OTHER, "draft_answer": draft}))
    assert cited_ids(body) == {"other_ledger"}
    assert {s["team_id"] for s in body["sources"]} == {OTHER}


def test_confidential_documents_are_cited_only_in_confidential_mode(gateway):
    draft = "The payroll budget of the core engineering team is 3.5 million hryvnias."
    public = ok(enrich(gateway, {"team_id": TEAM, "draft_answer": draft}))
    assert public["sources"] == []
    assert "hryvnias" not in str(public["sources"])
    confidential = ok(
        enrich(gateway, {"team_id": TEAM, "draft_answer": draft, "visibility": "confidential"})
    )
    assert cited_ids(confidential) == {"payroll"}


def test_filters_narrow_what_can_be_cited(gateway):
    request = SPEC_EXAMPLE | {"filters": {"doc_type": ["wiki"]}}
    body = ok(enrich(gateway, request))
    assert "rag_spec" not in cited_ids(body)


@pytest.fixture
def jwt_gateway():
    gw = build_gateway(auth=jwt_auth(), corpus=CORPUS)
    yield gw
    gw.client.close()


def test_ungranted_team_is_403_and_nothing_is_searched(jwt_gateway):
    token = mint(claims(teams={TEAM: ["member"]}))
    response = enrich(jwt_gateway, SPEC_EXAMPLE | {"team_id": OTHER}, token)
    assert response.status_code == 403
    assert response.json()["reason"] == "team_not_granted"
    assert jwt_gateway.store.searches == []
    assert jwt_gateway.services.recorder.log.flush(5)
    denied = jwt_gateway.services.recorder.log.query(action="enrich", decision="deny")
    assert denied and denied[0]["team_id"] == OTHER


def test_member_cannot_ask_for_confidential_mode(jwt_gateway):
    token = mint(claims(teams={TEAM: ["member"]}))
    response = enrich(jwt_gateway, SPEC_EXAMPLE | {"mode": "confidential"}, token)
    assert response.status_code == 403
    assert response.json()["reason"] == "confidential_not_granted"


def test_granted_request_is_audited_with_cited_documents(jwt_gateway):
    token = mint(claims(teams={TEAM: ["member"]}))
    body = ok(enrich(jwt_gateway, SPEC_EXAMPLE, token))
    assert jwt_gateway.services.recorder.log.flush(5)
    allowed = jwt_gateway.services.recorder.log.query(action="enrich", decision="allow")
    assert allowed[0]["doc_ids"] == [s["id"] for s in body["sources"]]
    assert allowed[0]["subject"] == "alice"


def test_missing_credentials_is_401(jwt_gateway):
    assert enrich(jwt_gateway, SPEC_EXAMPLE).status_code == 401


# --- bad input -------------------------------------------------------------------------------


def fields(response) -> set[str]:
    assert response.status_code == 422, response.text
    return {f["field"] for f in response.json()["fields"]}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"draft_answer": ""}, "draft_answer"),
        ({"draft_answer": "   \n "}, "draft_answer"),
        ({"max_docs": 0}, "max_docs"),
        ({"max_docs": 1000}, "max_docs"),
        ({"draft": "x"}, "draft"),
        ({"filters": {"team_id": OTHER}}, "filters.team_id"),
        ({"mode": "secret"}, "mode"),
    ],
)
def test_bad_input_is_422_naming_the_field(gateway, change, field):
    assert field in fields(enrich(gateway, SPEC_EXAMPLE | change))


def test_missing_draft_is_422(gateway):
    request = {k: v for k, v in SPEC_EXAMPLE.items() if k != "draft_answer"}
    assert "draft_answer" in fields(enrich(gateway, request))


def test_draft_longer_than_the_setting_is_422(clean_gateway_env):
    gw = with_enrich_settings(max_draft_chars=40)
    response = enrich(gw, SPEC_EXAMPLE)
    assert fields(response) == {"draft_answer"}
    assert "40" in response.json()["message"]
    assert gw.store.searches == []


# --- degradation ----------------------------------------------------------------------------


def test_embedder_down_falls_back_to_keyword_support(gateway):
    gateway.embedder.down = True
    body = ok(
        enrich(
            gateway, SPEC_EXAMPLE | {"draft_answer": f"{SPEC_EXAMPLE['draft_answer']} {NONSENSE}"}
        )
    )
    assert body["degraded"] is True
    assert len(body["degraded_reasons"]) == 1
    assert "embedder unavailable" in body["degraded_reasons"][0]
    assert body["mode"] == "bm25"
    assert cited_ids(body) == {"rag_spec"}
    assert body["unsupported_claims"] == [NONSENSE]


def test_vector_store_down_is_503(gateway):
    gateway.store.down = True
    response = enrich(gateway, SPEC_EXAMPLE)
    assert response.status_code == 503
    assert response.json()["error"] == "backend_unavailable"
