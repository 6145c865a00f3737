"""docs/router-config.example.yml against the router that reads it and the gateway it
configures: the file loads with a model of the DAGI Router loader's schema with extra keys
forbidden (the real loader silently drops keys it does not know), every agent tool is a
catalog tool at an absolute endpoint that is a POST route of the app and answers a real call,
the routing rules name what exists, and the provider's ``rag_profiles`` block loads as the
gateway's profiles file and equals the profiles the gateway ships."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from serve_app.profiles import ProfileSet
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus
from serve_app.tools.catalog import TOOL_ROUTE, TOOLS

CONFIG_PATH = Path(__file__).resolve().parents[4] / "docs" / "router-config.example.yml"
BY_NAME = {t.name: t for t in TOOLS}
PROVIDER = "rag-gateway"
# The least arguments each tool accepts (what an LLM would send for a plain question).
MINIMAL_ARGUMENTS: dict[str, dict[str, Any]] = {
    "rag.search_docs": {"query": "Milvus gateway deploy budget"},
    "rag.enrich_answer": {"draft_answer": "The gateway search notes mention Milvus."},
    "graph.query_context": {"intent": "members_of_dao"},
    "graph.explain_path": {"from": "alice", "to": "Milvus"},
}


# --- the DAGI Router's router-config.yml schema, as its loader documents it ---------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Node(_Strict):
    id: str
    role: str
    env: str
    description: str | None = None


class LlmProfile(_Strict):
    provider: str
    base_url: str
    model: str
    max_tokens: int = 1024
    temperature: float = 0.2
    timeout_ms: int = 30000
    description: str | None = None
    api_key_env: str | None = None
    top_p: float | None = None


class AgentTool(_Strict):
    id: str
    type: str
    description: str | None = None
    endpoint: str | None = None


class Agent(_Strict):
    description: str
    default_llm: str | None = None
    system_prompt: str | None = None
    tools: list[AgentTool] = Field(default_factory=list)


class RoutingRule(_Strict):
    id: str
    priority: int = 100
    when: dict[str, Any]
    use_llm: str | None = None
    use_provider: str | None = None
    use_metadata: str | None = None
    description: str | None = None


class Telemetry(_Strict):
    enabled: bool = True
    sink: str = "stdout"
    log_level: str = "info"
    metrics: list[str] = Field(default_factory=list)


class Policies(_Strict):
    rate_limiting: dict[str, Any] = Field(default_factory=dict)
    budget: dict[str, Any] = Field(default_factory=dict)


class RouterConfig(_Strict):
    node: Node
    llm_profiles: dict[str, LlmProfile]
    orchestrator_providers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    agents: dict[str, Agent] = Field(default_factory=dict)
    routing: list[RoutingRule] = Field(default_factory=list)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    policies: Policies = Field(default_factory=Policies)


def load_config() -> dict[str, Any]:
    return yaml.safe_load(CONFIG_PATH.read_text(encoding="utf-8"))


CONFIG = load_config()


ROUTER = RouterConfig.model_validate(CONFIG)
AGENT_TOOLS = [(a, t) for a, agent in ROUTER.agents.items() for t in agent.tools]
# One call per distinct endpoint: the agents share them.
DISTINCT_TOOLS = sorted({(t.endpoint or "", t.id) for _, t in AGENT_TOOLS})


def tool_param_id(value: Any) -> str:
    return value.id if isinstance(value, AgentTool) else str(value)


def full_path(endpoint: str) -> str:
    """The path of an absolute endpoint, relative to the provider base_url's own path."""
    base = urlparse(CONFIG["orchestrator_providers"][PROVIDER]["base_url"]).path.rstrip("/")
    path = urlparse(endpoint).path
    assert path.startswith(base), (endpoint, base)
    return path[len(base) :]


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


def test_the_config_loads_with_the_router_schema_and_nothing_is_dropped():
    """Extra keys forbidden at every level: a key the router's loader would ignore fails."""
    assert ROUTER.agents and {"ag_daarwizz", "ag_helion"} <= set(ROUTER.agents)
    assert "timeout_s" not in CONFIG_PATH.read_text(encoding="utf-8"), "times are timeout_ms"
    # Every tool of the catalog is configured for at least one agent.
    assert {t.id for _, t in AGENT_TOOLS} == set(BY_NAME)
    for wrong in ({"providers": {}}, {"routing_rules": []}):
        with pytest.raises(ValueError):
            RouterConfig.model_validate({**CONFIG, **wrong})
    bad_tool = {**CONFIG["agents"]["ag_helion"]}
    bad_tool["tools"] = [{**bad_tool["tools"][0], "provider": PROVIDER}]
    with pytest.raises(ValueError):
        RouterConfig.model_validate({**CONFIG, "agents": {"ag_helion": bad_tool}})


@pytest.mark.parametrize(("agent_id", "tool"), AGENT_TOOLS, ids=tool_param_id)
def test_each_agent_tool_is_a_catalog_tool_at_an_absolute_endpoint(agent_id, tool):
    assert tool.id in BY_NAME, f"{agent_id}: {tool.id!r} is not a catalog tool"
    assert tool.type == "external"
    url = urlparse(tool.endpoint or "")
    base = urlparse(CONFIG["orchestrator_providers"][PROVIDER]["base_url"])
    # A tool entry has no provider key for the loader: the endpoint carries the base URL.
    assert (url.scheme, url.netloc) == (base.scheme, base.netloc), tool.endpoint
    assert full_path(tool.endpoint or "") == BY_NAME[tool.id].endpoint
    assert (tool.description or "").strip(), f"{agent_id}: {tool.id} has no description"


def test_each_endpoint_is_a_post_route_of_the_app(gw):
    templates = post_templates(gw.client.app)
    assert TOOL_ROUTE in templates
    for _, tool in AGENT_TOOLS:
        spec = BY_NAME[tool.id]
        path = full_path(tool.endpoint or "")
        matches = {t: p for t in templates if (p := match_template(t, path)) is not None}
        assert matches, f"{path} is no POST route of the app"
        # It is the tool route, with this tool's function name as the parameter.
        assert matches.get(TOOL_ROUTE) == {"function": spec.function}, matches
        # The full HTTP route the tool completes into exists too.
        assert spec.route in templates


def test_the_provider_has_a_base_url_timeout_and_an_env_placeholder_for_the_key():
    provider = CONFIG["orchestrator_providers"][PROVIDER]
    url = urlparse(provider["base_url"])
    assert url.scheme in ("http", "https") and url.netloc
    assert isinstance(provider["timeout_ms"], int) and provider["timeout_ms"] > 0
    auth = provider["auth"]
    assert auth["header"] == "Authorization"
    # The key is an environment placeholder, never a literal credential.
    assert re.fullmatch(r"Bearer \$\{[A-Z][A-Z0-9_]*\}", auth["value"]), auth["value"]


def test_routing_rules_name_what_exists_and_rag_off_agents_never_reach_the_gateway():
    rules = sorted(ROUTER.routing, key=lambda r: r.priority)
    assert len({r.id for r in rules}) == len(rules)
    for rule in rules:
        targets = [x for x in (rule.use_llm, rule.use_provider, rule.use_metadata) if x]
        assert len(targets) == 1, f"rule {rule.id}: one of use_llm/use_provider/use_metadata"
        if rule.use_llm:
            assert rule.use_llm in ROUTER.llm_profiles, rule.id
        if rule.use_provider:
            assert rule.use_provider in ROUTER.orchestrator_providers, rule.id
    assert any(r.use_provider == PROVIDER for r in rules)
    for agent in ROUTER.agents.values():
        assert agent.default_llm is None or agent.default_llm in ROUTER.llm_profiles
    first_provider_rule = min(r.priority for r in rules if r.use_provider == PROVIDER)
    loaded = ProfileSet.load(CONFIG_PATH)
    for agent_id, agent in ROUTER.agents.items():
        if loaded.for_agent(agent_id).profile.rag_mode != "off":
            continue
        assert not agent.tools, f"{agent_id}: rag_mode off with tools"
        # An LLM-only rule for this agent is decided before any rule that reaches the gateway.
        own = [r for r in rules if r.when.get("agent") == agent_id and r.use_llm]
        assert own and own[0].priority < first_provider_rule, agent_id


def test_the_config_loads_as_the_gateways_profiles_file():
    loaded = ProfileSet.load(CONFIG_PATH)
    block = CONFIG["orchestrator_providers"][PROVIDER]["rag_profiles"]
    assert loaded.default.rag_mode == block["default"]["rag_mode"]
    assert set(loaded.agents) == set(block["agents"]) == set(ROUTER.agents)
    for agent_id, raw in block["agents"].items():
        profile = loaded.for_agent(agent_id)
        assert profile.agent_id == agent_id
        for key, value in raw.items():
            assert getattr(profile.profile, key) == value, (agent_id, key)
    modes = {a: loaded.for_agent(a).profile.rag_mode for a in ROUTER.agents}
    assert modes["ag_daarwizz"] == "strict" and modes["ag_helion"] == "light"
    assert "off" in modes.values(), "no chat agent with RAG off"


def test_the_gateway_ships_the_example_profiles_by_default():
    """Profiles are on out of the box: the packaged file (profiles.file unset) holds the
    same default and agents as the router example."""
    packaged, example = ProfileSet.load(), ProfileSet.load(CONFIG_PATH)
    assert packaged.default == example.default
    assert packaged.agents == example.agents


def test_a_router_config_without_one_rag_profiles_block_is_refused():
    config = yaml.safe_load(CONFIG_PATH.read_text(encoding="utf-8"))
    del config["orchestrator_providers"][PROVIDER]["rag_profiles"]
    with pytest.raises(ValueError, match="rag_profiles"):
        ProfileSet.parse(config, "router.yml")


def is_route_404(response: Any) -> bool:
    """A 404 of the router itself (no such route or tool), not a tool's own "not found"."""
    if response.status_code != 404:
        return False
    body = response.json()
    message = body.get("message", "")
    return message.startswith("no route ") or message.startswith("no tool ")


@pytest.mark.parametrize(("endpoint", "tool_id"), DISTINCT_TOOLS)
def test_each_endpoint_answers_a_call_with_minimal_arguments(gw, headers, endpoint, tool_id):
    path = full_path(endpoint)
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
