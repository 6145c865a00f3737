"""Dependencies shared by the routes, as ``Annotated`` aliases."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request

from serve_app.auth import Principal
from serve_app.http.errors import GatewayError, trace_id_of
from serve_app.http.rate_limits import Limit, RateLimited
from serve_app.http.shared import Shared
from serve_app.request import RequestContext
from serve_app.timing import stage

# Route path -> audited action name.
ACTIONS = {
    "/rag/search_docs": "search",
    "/rag/enrich_answer": "enrich",
    "/graph/query": "graph.query",
    "/graph/intents": "graph.intents",
    "/graph/explain_path": "graph.explain_path",
    "/graph/entities": "graph.upsert",
    "/ingest/documents": "ingest",
    "/ingest/events": "ingest.events",
    "/ingest/sync": "ingest.sync",
    "/audit/decisions": "audit.read",
    "/admin/reindex": "admin.reindex",
    "/admin/usage": "usage.read",
}


async def authenticate(request: Request, action: str | None = None) -> Principal:
    """The verified caller of ``request``. A failure (401, or 503 when the JWKS cannot be
    fetched) is audited as a deny with the subject unknown, as ``action`` (default: the
    route's action name), and raised."""
    shared: Shared = request.app.state.shared
    authenticator = shared.authenticator
    started = time.perf_counter()
    try:
        with stage("auth"):
            return await authenticator.authenticate(request.headers)
    except GatewayError as exc:
        path = request.url.path
        try:
            found = authenticator.credential(request.headers)
        except GatewayError:
            found = ("malformed", "")
        shared.recorder.error(
            exc,
            trace_id_of(request),
            None,
            started,
            action=action or ACTIONS.get(path, path[:32]),
            path=path,
            auth_method=found[0] if found else "none",
            denied=True,
        )
        raise


async def _principal(request: Request) -> Principal:
    """The verified caller; runs before the body is validated, so an unauthenticated request
    gets 401 whatever its body holds."""
    return await authenticate(request)


# Body keys that name the team of a request, and lists whose items may name theirs.
TEAM_KEYS = ("team_id", "dao_id", "microdao_id")


def named_teams(request: Request, body: object) -> set[str]:
    """The teams a request names: ``X-Team-Id`` and the team keys of the JSON body, of its
    ``documents[]`` and of its ``events[].meta`` (at most 64)."""
    teams = {request.headers.get("x-team-id", "").strip()}
    items: list[object] = [body]
    if isinstance(body, dict):
        for key in ("documents", "events"):
            if isinstance(body.get(key), list):
                items += body[key][:1000]
    for item in items:
        if isinstance(item, dict):
            for source in (item, item.get("meta")):
                if isinstance(source, dict):
                    teams.update(v for k in TEAM_KEYS if isinstance(v := source.get(k), str))
        if len(teams) > 64:
            break
    teams.discard("")
    return teams


async def rate_limit(
    request: Request, principal: Principal, action: str, agent_id: str = ""
) -> None:
    """Take this request's tokens (serve_app/http/rate_limits.py): the credential's, then each
    named team's that the credential grants (or any, for a dev caller trusted from the
    body). An empty bucket is audited as a deny and raised (429)."""
    shared: Shared = request.app.state.shared
    limiter = shared.rate_limiter
    if not limiter.settings.enabled:
        return
    started = time.perf_counter()
    body: object = None
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = await request.json()  # FastAPI parsed it already: the cached value
        except Exception:
            body = None  # the route answers the malformed body itself
    teams = named_teams(request, body)
    if not principal.trusts_body:
        teams &= set(principal.teams)
    profile = shared.profiles.for_agent(agent_id or principal.agent_id).profile
    limit = (
        Limit(profile.requests_per_s, profile.burst or limiter.settings.per_credential_burst)
        if profile.requests_per_s
        else None
    )
    credential = principal.key_id or principal.sub or "dev"
    try:
        await limiter.admit(f"{principal.method}:{credential}", teams, limit)
    except RateLimited as exc:
        path = request.url.path
        shared.recorder.error(
            exc,
            trace_id_of(request),
            principal,
            started,
            action=action,
            path=path,
            team_id=next(iter(sorted(teams)), ""),
            denied=True,
        )
        raise


async def request_context(
    request: Request, principal: Annotated[Principal, Depends(_principal)]
) -> RequestContext:
    """The verified caller, the trace id and the profile-routing agent of one request,
    after its rate limits."""
    routed = request.headers.get("x-agent-id", "").strip()[:256]
    shared: Shared = request.app.state.shared
    permission = shared.settings.profiles.route_permission
    if routed and not (principal.trusts_body or permission in principal.permissions):
        routed = ""  # only a router's credential may pick another agent's profile
    path = request.url.path
    await rate_limit(request, principal, ACTIONS.get(path, path[:32]), routed)
    return RequestContext(trace_id_of(request), principal, routed_agent=routed)


CurrentPrincipal = Annotated[Principal, Depends(_principal)]
# The verified caller, the trace id and the start of the request, as one value.
Caller = Annotated[RequestContext, Depends(request_context)]
