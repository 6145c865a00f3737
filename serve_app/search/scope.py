"""The prologue of every read of the index (rag.search_docs, and rag.enrich_answer through
it): who the caller is in the team, the one ``SearchFilter`` that scope allows, and the agent
profile the request runs under — checked before anything is searched, so a caller outside
the scope learns nothing, not even about limits."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.protocols import SearchFilter
from serve_app.access.context import AccessContext
from serve_app.access.policy import Policy
from serve_app.contracts import SearchFilters
from serve_app.profiles import AgentProfile, ProfileSet
from serve_app.request import RequestContext


@dataclass(frozen=True)
class SearchScope:
    ctx: AccessContext
    flt: SearchFilter
    agent: AgentProfile


def search_scope(
    rc: RequestContext,
    policy: Policy,
    profiles: ProfileSet,
    *,
    team_id: str,
    user_id: str,
    agent_id: str,
    visibility: str,
    filters: SearchFilters,
) -> SearchScope:
    """The scope of one request of ``rc``'s caller in ``team_id``.

    Raises:
        Forbidden: the team, user, agent, privacy mode, doc types or project are not granted.
    """
    ctx = AccessContext.for_caller(
        rc.principal,
        policy,
        team_id=team_id,
        user_id=user_id,
        agent_id=agent_id,
        visibility=visibility,
    )
    flt = ctx.search_filter(filters)
    return SearchScope(ctx, flt, profiles.for_agent(ctx.agent_id or rc.routed_agent))
