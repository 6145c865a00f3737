"""Per-agent RAG profiles: how much retrieval an agent gets, from a YAML file keyed by agent
id (``profiles.file``; the packaged serve_app/profiles.yaml by default). A DAGI-Router config
works as that file too: its rag-gateway provider entry's ``rag_profiles`` block is read
(docs/router-config.example.yml); in a plain profiles file an agent block's ``rag_profile``
is its profile.

The agent is the verified one — the token's agent claim or the API key's agent — and only a
credential holding ``profiles.route_permission`` (a router calling for its agents) may name
another with ``X-Agent-Id``. Everyone else gets ``default``.

Modes (docs/configuration.md, "RAG profiles"):
- ``off``: search and enrich answer at once, with no retrieval, empty results and a notice.
- ``light``: one retrieval method (``light_method``, BM25 by default: no embedding at all),
  no rerank, no graph expansion, at most ``max_docs_per_query`` hits.
- ``strict``: hybrid retrieval, rerank when a reranker is configured, ``min_score`` on the
  fused score and ``min_support`` per enrich claim when set.

A request may narrow its profile — a lower ``rag_mode`` (off < light < strict), fewer
documents or tokens, a higher ``min_score`` — never widen it: larger values are clamped and
the response says so (``profile.clamped``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

RagMode = Literal["off", "light", "strict"]
MODE_ORDER: dict[str, int] = {"off": 0, "light": 1, "strict": 2}
PACKAGED = Path(__file__).with_name("profiles.yaml")


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rag_mode: RagMode = "strict"
    # Passages returned (search) and documents cited (enrich) at most.
    max_docs_per_query: int = Field(10, ge=1, le=100)
    # Tokens of returned passages at most (None: only the request's own budget).
    max_context_tokens: int | None = Field(None, ge=1, le=1_000_000)
    # Seconds a cached answer serves this agent (None: cache.ttl_s; 0: never cached).
    cache_ttl_s: float | None = Field(None, ge=0, le=86_400)
    # light: the one method used.
    light_method: Literal["bm25", "dense"] = "bm25"
    # strict: floor of the fused score of a search hit, and of an enrich claim's support.
    min_score: float | None = Field(None, ge=0.0, le=1.0)
    min_support: float | None = Field(None, ge=0.0, le=1.0)
    # This agent's own rate limit per credential (None: rate_limit.per_credential_*).
    requests_per_s: float | None = Field(None, gt=0, le=1_000_000)
    burst: int | None = Field(None, ge=1, le=10_000_000)


@dataclass(frozen=True)
class AgentProfile:
    """The profile a request runs under, and whose it is (``""``: the default)."""

    agent_id: str
    profile: Profile

    @property
    def name(self) -> str:
        return self.agent_id or "default"


class ProfileSet:
    def __init__(self, default: Profile, agents: dict[str, Profile], source: str = "") -> None:
        self.default = default
        self.agents = agents
        self.source = source

    @classmethod
    def load(cls, path: str | Path = "") -> ProfileSet:
        """The profiles of ``path`` (the packaged file when empty).

        Raises:
            ValueError: the file is missing or a profile is invalid (named in the message).
        """
        file = Path(path) if path else PACKAGED
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ValueError(f"profiles file {file}: {exc}") from exc
        return cls.parse(data, str(file))

    @classmethod
    def parse(cls, data: dict[str, Any], source: str = "") -> ProfileSet:
        if not isinstance(data, dict):
            raise ValueError(f"profiles file {source}: expected a mapping")
        if "orchestrator_providers" in data:
            data = router_profiles(data, source)

        def one(name: str, raw: Any) -> Profile:
            if isinstance(raw, dict) and "rag_profile" in raw:  # a router agent block
                raw = raw["rag_profile"]
            try:
                return Profile.model_validate(raw or {})
            except ValidationError as exc:
                raise ValueError(f"profiles file {source}: profile {name!r}: {exc}") from exc

        default = one("default", data.get("default"))
        agents = {str(k): one(str(k), v) for k, v in (data.get("agents") or {}).items()}
        return cls(default, agents, source)

    def for_agent(self, agent_id: str) -> AgentProfile:
        profile = self.agents.get(agent_id) if agent_id else None
        return AgentProfile(agent_id, profile) if profile else AgentProfile("", self.default)


def router_profiles(config: dict[str, Any], source: str) -> dict[str, Any]:
    """The ``{default, agents}`` of a DAGI-Router config: the ``rag_profiles`` block of the
    one provider entry that has it (``orchestrator_providers.<id>.rag_profiles``; the
    router's loader keeps a provider entry whole and ignores keys it does not know).

    Raises:
        ValueError: no provider, or more than one, carries ``rag_profiles``.
    """
    providers = config.get("orchestrator_providers") or {}
    found = {
        name: entry["rag_profiles"]
        for name, entry in providers.items()
        if isinstance(entry, dict) and "rag_profiles" in entry
    }
    if len(found) != 1:
        which = ", ".join(sorted(found)) or "none"
        raise ValueError(
            f"profiles file {source}: a router config needs exactly one "
            f"orchestrator_providers.<id>.rag_profiles block (found: {which})"
        )
    block = next(iter(found.values()))
    if not isinstance(block, dict):
        raise ValueError(f"profiles file {source}: rag_profiles must be a mapping")
    return block


# The profiles of a service built without a file (unit tests, the library API): the default
# profile only, which changes nothing in a request.
DEFAULT_PROFILES = ProfileSet(Profile(max_docs_per_query=100), {}, "built-in")


def narrower_mode(profile: RagMode, requested: str | None) -> str:
    """The request's mode where it is below the profile's, else the profile's."""
    if requested and MODE_ORDER[requested] < MODE_ORDER[profile]:
        return requested
    return profile


@dataclass(frozen=True)
class SearchPlan:
    """A search request after its profile: what runs, and what the profile cut."""

    rag_mode: str
    top_k: int
    method: str
    updates: dict[str, Any]
    clamped: tuple[str, ...]


def plan_search(
    agent: AgentProfile,
    *,
    requested_mode: str | None,
    top_k: int,
    method: str,
    rerank: bool | None,
    graph: bool,
    min_score: float | None,
    max_context_tokens: int | None,
    method_asked: bool = False,
) -> SearchPlan:
    """Narrow a search to ``agent``'s profile. ``top_k``/``method`` are the request's (or the
    defaults; ``method_asked``: the request named its method); ``updates`` are the request
    fields to replace."""
    p = agent.profile
    clamped: list[str] = []
    mode = narrower_mode(p.rag_mode, requested_mode)
    if requested_mode and mode != requested_mode:
        clamped.append("rag_mode")
    if top_k > p.max_docs_per_query:
        clamped.append("top_k")
        top_k = p.max_docs_per_query
    updates: dict[str, Any] = {}
    if p.max_context_tokens is not None and (
        max_context_tokens is None or max_context_tokens > p.max_context_tokens
    ):
        if max_context_tokens is not None:
            clamped.append("max_context_tokens")
        updates["max_context_tokens"] = p.max_context_tokens
    if mode == "light":
        if method_asked and method != p.light_method:
            clamped.append("search_mode")
        method = p.light_method
        if rerank:
            clamped.append("rerank")
        if graph:
            clamped.append("graph")
        updates.update(rerank=False, graph=None)
    elif (
        mode == "strict"
        and p.min_score is not None
        and (min_score is None or min_score < p.min_score)
    ):
        updates["min_score"] = p.min_score
    return SearchPlan(mode, top_k, method, updates, tuple(clamped))
