"""Per-agent RAG profiles (serve_app/profiles.py): the file, the narrowing rules, and what
each mode does to rag.search_docs and rag.enrich_answer over the in-process gateway."""

from __future__ import annotations

import pytest
import yaml

from serve_app.profiles import MODE_ORDER, AgentProfile, Profile, ProfileSet, plan_search
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
QUERY = {"team_id": "dao_a", "query": "Milvus gateway search notes deploy", "top_k": 8}
PROFILES = {
    "default": {"rag_mode": "strict", "max_docs_per_query": 50},
    "agents": {
        "ag_light": {"rag_mode": "light", "max_docs_per_query": 3, "max_context_tokens": 500},
        "ag_off": {"rag_mode": "off"},
        "ag_strict": {"rag_mode": "strict", "max_docs_per_query": 6, "min_score": 0.5},
        # A DAGI-Router agent block: its rag_profile is the profile.
        "ag_router": {"tools": [], "rag_profile": {"rag_mode": "light"}},
    },
}


def token(agent: str = "", **extra) -> dict[str, str]:
    payload = claims(teams={"dao_a": ["member"]}, agent_id=agent or None, **extra)
    return {"authorization": f"Bearer {mint(payload)}"}


@pytest.fixture
def gw(tmp_path):
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump(PROFILES))
    return build_gateway(
        corpus=tenancy_corpus(), policy=TENANCY_POLICY, profiles={"file": str(path)}
    )


def search(gw, hdrs, body=QUERY):
    r = gw.client.post("/rag/search_docs", json=body, headers=hdrs)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_file_and_router_blocks_load_and_errors_name_the_profile(tmp_path):
    profiles = ProfileSet.parse(PROFILES)
    assert profiles.for_agent("ag_router").profile.rag_mode == "light"
    assert profiles.for_agent("nobody") == AgentProfile("", profiles.default)
    with pytest.raises(ValueError, match="ag_bad"):
        ProfileSet.parse({"agents": {"ag_bad": {"rag_mode": "loud"}}})
    with pytest.raises(ValueError, match="profiles file"):
        ProfileSet.load(tmp_path / "missing.yaml")
    assert ProfileSet.load().default.rag_mode == "strict"  # the packaged file


def test_a_request_narrows_its_profile_and_never_widens_it():
    light = AgentProfile("a", Profile(rag_mode="light", max_docs_per_query=3))
    kw = dict(rerank=True, graph=True, min_score=None, max_context_tokens=None)
    plan = plan_search(
        light, requested_mode="strict", top_k=8, method="hybrid", method_asked=True, **kw
    )
    assert (plan.rag_mode, plan.top_k, plan.method) == ("light", 3, "bm25")
    assert set(plan.clamped) == {"rag_mode", "top_k", "search_mode", "rerank", "graph"}
    assert plan.updates == {"rerank": False, "graph": None}
    assert plan_search(light, requested_mode="off", top_k=2, method="bm25", **kw).rag_mode == "off"
    strict = AgentProfile("s", Profile(min_score=0.4, max_context_tokens=100))
    plan = plan_search(
        strict, requested_mode=None, top_k=5, method="dense", rerank=None, graph=False,
        min_score=0.1, max_context_tokens=1000,
    )  # fmt: skip
    assert plan.updates == {"min_score": 0.4, "max_context_tokens": 100}
    assert plan.method == "dense" and plan.clamped == ("max_context_tokens",)
    higher = plan_search(
        strict, requested_mode=None, top_k=5, method="hybrid", rerank=None, graph=False,
        min_score=0.9, max_context_tokens=50,
    )  # fmt: skip
    assert higher.updates == {} and higher.clamped == ()
    assert sorted(MODE_ORDER, key=MODE_ORDER.get) == ["off", "light", "strict"]


def test_the_verified_agent_picks_the_profile(gw):
    light = search(gw, token("ag_light"))
    assert light["profile"] == {
        "name": "ag_light",
        "rag_mode": "light",
        "clamped": ["top_k"],
    }
    assert light["mode"] == "bm25" and 0 < len(light["matches"]) <= 3
    default = search(gw, token())
    assert default["profile"] == {"name": "default", "rag_mode": "strict", "clamped": []}
    assert default["mode"] == "hybrid"


def test_off_answers_at_once_with_a_notice(gw):
    body = search(gw, token("ag_off"))
    assert body["matches"] == [] and body["mode"] == "off" and "off" in body["notice"]
    assert not [texts for texts, kind in gw.embedder.calls if kind == "query"]
    enrich = gw.client.post(
        "/rag/enrich_answer",
        json={"team_id": "dao_a", "draft_answer": "Milvus gateway search notes deploy."},
        headers=token("ag_off"),
    ).json()
    assert enrich["mode"] == "off" and enrich["sources"] == []
    assert enrich["enriched_answer"] == "Milvus gateway search notes deploy."


def test_a_request_may_turn_rag_off_or_light_itself(gw):
    assert search(gw, token(), QUERY | {"rag_mode": "off"})["matches"] == []
    light = search(gw, token(), QUERY | {"rag_mode": "light"})
    assert light["profile"]["rag_mode"] == "light" and light["mode"] == "bm25"
    widened = search(gw, token("ag_light"), QUERY | {"rag_mode": "strict", "top_k": 2})
    assert widened["profile"]["rag_mode"] == "light" and widened["profile"]["clamped"] == [
        "rag_mode"
    ]


def test_strict_applies_the_minimum_score(gw):
    body = search(gw, token("ag_strict"), QUERY | {"explain": True})
    assert body["profile"]["rag_mode"] == "strict" and len(body["matches"]) <= 6
    assert all(m["score"] >= 0.5 for m in body["matches"])


def test_x_agent_id_counts_only_for_a_routing_credential(gw):
    header = {"x-agent-id": "ag_light"}
    plain = search(gw, token() | header)
    assert plain["profile"]["name"] == "default"
    router = search(gw, token(permissions=["rag:route_agents"]) | header)
    assert router["profile"]["name"] == "ag_light"
    # A verified agent of the credential comes first, whatever the header says.
    own = search(gw, token("ag_strict", permissions=["rag:route_agents"]) | header)
    assert own["profile"]["name"] == "ag_strict"


def test_light_enrich_cites_at_most_the_profiles_documents(gw):
    draft = "Milvus gateway search notes about doc deploy budget. Notes about message deploy."
    body = gw.client.post(
        "/rag/enrich_answer",
        json={"team_id": "dao_a", "draft_answer": draft, "max_docs": 10},
        headers=token("ag_light"),
    ).json()
    assert body["profile"]["rag_mode"] == "light" and "max_docs" in body["profile"]["clamped"]
    assert len(body["sources"]) <= 3 and body["mode"] == "bm25"
