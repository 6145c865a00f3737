"""docs/router-config.example.yml against the gateway it configures: every agent tool is a
catalog tool at its own endpoint, that endpoint is a POST route of the app and answers a
real call, the provider and every agent's RAG profile are well-formed, and the file loads as
the gateway's profiles file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus
from serve_app.tools.catalog import TOOL_ROUTE, TOOLS

CONFIG_PATH = Path(__file__).resolve().parents[2] / "docs" / "router-config.example.yml"
BY_NAME = {t.name: t for t in TOOLS}
RAG_MODES = {"off", "light", "strict"}
PROFILE_NUMBERS = ("max_context_tokens", "max_docs_per_query")
# The least arguments each tool accepts (what an LLM would send for a plain question).
MINIMAL_ARGUMENTS: dict[str, dict[str, Any]] = {
    "rag.search_docs": {"query": "Milvus gateway deploy budget"},
    "rag.enrich_answer": {"draft_answer": "The gateway search notes mention Milvus."},
    "graph.query_context": {"intent": "members_of_dao"},
    "graph.explain_path": {"from": "alice", "to": "Milvus"},
}


def load_config() -> dict[str, Any]:
    return yaml.safe_load(CONFIG_PATH.read_text(encoding="utf-8"))


CONFIG = load_config()


def agent_tools() -> list[tuple[str, dict[str, Any]]]:
    return [
        (agent_id, tool)
        for agent_id, agent in CONFIG["agents"].items()
        for tool in agent.get("tools") or []
    ]


def tool_param_id(value: Any) -> str:
    return value["id"] if isinstance(value, dict) else str(value)


AGENT_TOOLS = agent_tools()
# One call per distinct (provider, endpoint): the agents share them.
DISTINCT_TOOLS = sorted({(t["provider"], t["endpoint"], t["id"]) for _, t in AGENT_TOOLS})


def full_path(tool: dict[str, Any]) -> str:
    """The path the router posts to: the provider base_url's path joined with the endpoint
    (or the endpoint's own path when it is absolute)."""
    endpoint = tool["endpoint"]
    if urlparse(endpoint).scheme:
        return urlparse(endpoint).path
    base = urlparse(CONFIG["providers"][tool["provider"]]["base_url"]).path.rstrip("/")
    return f"{base}{endpoint}"


def post_templates(app: Any) -> set[str]:
    """The path templates of the app's POST routes (included routers walked too)."""
    found: set[str] = set()

    def walk(routes: Any) -> None:
        for route in routes:
            if hasattr(route, "effective_route_contexts"):  # FastAPI's included router
                walk(route.effective_route_contexts())
                continue
            path, methods = getattr(route, "path", None), getattr(route, "methods", None)
            if path and methods and "POST" in methods:
                found.add(path)

    walk(app.routes)
    return found


def match_template(template: str, path: str) -> dict[str, str] | None:
    """The path parameters when ``path`` fits ``template`` (``/tools/{function}``)."""
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
    m = re.fullmatch(pattern, path)
    return m.groupdict() if m else None


@pytest.fixture(scope="module")
def gw():
    return build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())


@pytest.fixture(scope="module")
def headers() -> dict[str, str]:
    return {"authorization": f"Bearer {mint(claims(teams={'dao_a': ['member']}))}"}


def test_the_config_has_agents_with_tools_and_the_extra_router_blocks():
    assert {"default", "agents", "providers", "routing_rules"} <= set(CONFIG)
    assert {"ag_daarwizz", "ag_helion"} <= set(CONFIG["agents"])
    assert AGENT_TOOLS, "no agent has a tool"
    # Every tool of the catalog is configured for at least one agent.
    assert {t["id"] for _, t in AGENT_TOOLS} == set(BY_NAME)


@pytest.mark.parametrize(("agent_id", "tool"), AGENT_TOOLS, ids=lambda v: tool_param_id(v))
def test_each_agent_tool_is_a_catalog_tool_at_its_own_endpoint(agent_id, tool):
    assert tool["id"] in BY_NAME, f"{agent_id}: {tool['id']!r} is not a catalog tool"
    spec = BY_NAME[tool["id"]]
    assert tool["type"] == "external"
    assert tool.get("method", "POST") == "POST"
    assert tool["provider"] in CONFIG["providers"], f"{agent_id}: unknown provider"
    assert full_path(tool) == spec.endpoint
    assert tool.get("description", "").strip(), f"{agent_id}: {tool['id']} has no description"


def test_endpoints_are_consistently_relative_to_the_provider():
    kinds = {bool(urlparse(t["endpoint"]).scheme) for _, t in AGENT_TOOLS}
    assert kinds == {False}, "endpoints mix absolute URLs and paths"
    assert all(t["endpoint"].startswith("/") for _, t in AGENT_TOOLS)


def test_each_endpoint_is_a_post_route_of_the_app(gw):
    templates = post_templates(gw.client.app)
    assert TOOL_ROUTE in templates
    for _, tool in AGENT_TOOLS:
        spec = BY_NAME[tool["id"]]
        path = full_path(tool)
        matches = {t: p for t in templates if (p := match_template(t, path)) is not None}
        assert matches, f"{path} is no POST route of the app"
        # It is the tool route, with this tool's function name as the parameter.
        assert matches.get(TOOL_ROUTE) == {"function": spec.function}, matches
        # The full HTTP route the tool completes into exists too.
        assert spec.route in templates


def test_the_provider_has_a_base_url_timeout_and_an_env_placeholder_for_the_key():
    providers = CONFIG["providers"]
    assert set(providers) >= {t["provider"] for _, t in AGENT_TOOLS}
    provider = providers["rag-gateway"]
    url = urlparse(provider["base_url"])
    assert url.scheme in ("http", "https") and url.netloc
    assert isinstance(provider["timeout_s"], int | float) and provider["timeout_s"] > 0
    auth = provider["auth"]
    assert auth["header"] == "Authorization"
    # The key is an environment placeholder, never a literal credential.
    assert re.fullmatch(r"Bearer \$\{[A-Z][A-Z0-9_]*\}", auth["value"]), auth["value"]


def profile_problems(name: str, profile: Any) -> list[str]:
    if not isinstance(profile, dict):
        return [f"{name}: no rag_profile mapping"]
    problems = []
    mode = profile.get("rag_mode")
    # An unquoted `off` is the boolean False in YAML 1.1: it must be the string.
    if not isinstance(mode, str) or mode not in RAG_MODES:
        problems.append(f"{name}: rag_mode {mode!r} is not one of {sorted(RAG_MODES)}")
    for key in PROFILE_NUMBERS:
        value = profile.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(f"{name}: {key} {value!r} is not a positive int")
    ttl = profile.get("cache_ttl_s", 0)  # optional; 0 = never cached
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl < 0:
        problems.append(f"{name}: cache_ttl_s {ttl!r} is not a number of seconds")
    return problems


def test_every_agent_and_the_default_have_a_valid_rag_profile():
    problems = profile_problems("default", CONFIG["default"])
    for agent_id, agent in CONFIG["agents"].items():
        problems += profile_problems(agent_id, agent.get("rag_profile"))
    assert not problems, problems


def test_the_spec_agents_have_their_modes_and_rag_off_agents_get_no_tools():
    agents = CONFIG["agents"]
    modes = {a: agents[a]["rag_profile"]["rag_mode"] for a in agents}
    assert modes["ag_daarwizz"] == "strict" and modes["ag_helion"] == "light"
    assert "off" in modes.values(), "no chat agent with RAG off"
    for agent_id, mode in modes.items():
        if mode == "off":
            assert not agents[agent_id].get("tools"), f"{agent_id}: rag_mode off with tools"


def test_routing_rules_name_catalog_tools_and_rag_off_calls_nothing():
    rules = CONFIG["routing_rules"]
    assert len({r["id"] for r in rules}) == len(rules)
    used = set()
    for rule in rules:
        tools = [rule["use_tool"]] if "use_tool" in rule else rule.get("deny_tools", [])
        assert tools, f"rule {rule['id']} neither uses nor denies a tool"
        assert set(tools) <= set(BY_NAME), rule
        used |= set(tools)
    off = [r for r in rules if r.get("when", {}).get("rag_mode") == "off"]
    assert off and set(off[0]["deny_tools"]) == set(BY_NAME)
    # RAG off is decided before any rule that would call a tool.
    first_call = min(r["priority"] for r in rules if "use_tool" in r)
    assert off[0]["priority"] < first_call
    assert {"rag.search_docs", "rag.enrich_answer", "graph.query_context"} <= used


def test_the_config_loads_as_the_gateways_profiles_file():
    profiles = pytest.importorskip("serve_app.profiles")
    loaded = profiles.ProfileSet.load(CONFIG_PATH)
    assert loaded.default.rag_mode == CONFIG["default"]["rag_mode"]
    assert loaded.default.max_docs_per_query == CONFIG["default"]["max_docs_per_query"]
    for agent_id, agent in CONFIG["agents"].items():
        profile = loaded.for_agent(agent_id)
        assert profile.agent_id == agent_id
        for key, value in agent["rag_profile"].items():
            assert getattr(profile.profile, key) == value, (agent_id, key)


def is_route_404(response: Any) -> bool:
    """A 404 of the router itself (no such route or tool), not a tool's own "not found"."""
    if response.status_code != 404:
        return False
    body = response.json()
    message = body.get("message", "")
    return message.startswith("no route ") or message.startswith("no tool ")


@pytest.mark.parametrize(("provider", "endpoint", "tool_id"), DISTINCT_TOOLS)
def test_each_endpoint_answers_a_call_with_minimal_arguments(
    gw, headers, provider, endpoint, tool_id
):
    path = full_path({"provider": provider, "endpoint": endpoint})
    r = gw.client.post(path, json=MINIMAL_ARGUMENTS[tool_id], headers=headers)
    assert not is_route_404(r), r.text
    assert r.status_code == 200 or 400 <= r.status_code < 500, r.text
    body = r.json()
    if r.status_code == 200:
        assert body["trace_id"] and body["degraded"] is False
    else:
        # A tool's own answer: the gateway's error shape, e.g. explain_path's unknown entity.
        assert {"error", "message", "trace_id"} <= set(body), body
        if r.status_code == 404:
            assert body["error"] == "not_found" and "no entity" in body["message"]


def test_a_route_404_is_told_apart_from_a_tool_404(gw, headers):
    assert is_route_404(gw.client.post("/tools/no/such", json={}, headers=headers))
    assert is_route_404(gw.client.post("/tools/rag_nothing", json={}, headers=headers))
    entity = gw.client.post(
        "/tools/graph_explain_path", json={"from": "nobody", "to": "nothing"}, headers=headers
    )
    assert entity.status_code == 404 and not is_route_404(entity)
