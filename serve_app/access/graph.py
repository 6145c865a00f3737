"""What a caller may do and see in the graph: the scope parameters of every statement it runs,
whether it may send its own Cypher or write entities, and whether a returned node,
relationship or path is inside its scope (``AccessContext`` decides the team and visibility;
these add the graph's own rules, document ACLs included)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from deployments import acl
from deployments.errors import Forbidden
from deployments.protocols import GraphScope, GraphStore
from serve_app.access.context import AccessContext, forbidden


def graph_scope(ctx: AccessContext) -> GraphScope:
    """``$team_id``, ``$visibilities``, the policy parameters and ``$acl_principals`` of
    every graph statement this caller runs."""
    return GraphScope(
        team_id=ctx.team_id,
        visibilities=ctx.allowed_visibilities,
        policy=ctx.policy.graph_params(
            ctx.team_id, ctx.roles, ctx.groups, ctx.permissions, ctx.allowed_doc_types
        ),
        acl_principals=ctx.acl_principals,
    )


# Node properties that serve only the gateway's own access checks (``may_see_entity`` reads
# them): who a document admits or denies is never part of an answer, nor of what an LLM
# sees (issue 38, item 6).
ACCESS_PROPERTIES = frozenset({"acl_allow", "acl_deny", "acl_restricted"})
_ACCESS_NAME = re.compile(r"acl_(?:allow|deny|restricted)", re.IGNORECASE)


def without_access_properties(value: Any) -> Any:
    """``value`` (rows, paths, nodes as the graph store serialises them) without any
    ``ACCESS_PROPERTIES`` key, at any depth. Apply after the ``may_see_*`` checks."""
    if isinstance(value, dict):
        return {
            k: without_access_properties(v) for k, v in value.items() if k not in ACCESS_PROPERTIES
        }
    if isinstance(value, list):
        return [without_access_properties(v) for v in value]
    return value


def check_cypher_names(cypher: str) -> None:
    """Raises Forbidden when Cypher names an access property: ``RETURN d.acl_allow`` would
    hand out the tokens (subjects, group names) ``without_access_properties`` keeps in."""
    if _ACCESS_NAME.search(cypher):
        raise forbidden(
            "Cypher may not read documents' access lists (acl_allow, acl_deny, acl_restricted)",
            "cypher_reads_access_lists",
            field="cypher",
            hint="leave them out: the gateway applies them to every answer",
        )


def check_cypher(ctx: AccessContext) -> None:
    """Raises Forbidden unless the roles may send their own Cypher, and nothing in the
    team is hidden from the caller by doc-type, project or skill policies (the plan check
    proves team and visibility only; a restricted caller uses the intents, which carry
    those policies as parameters)."""
    if not ctx.policy.may_send_cypher(ctx.roles):
        raise forbidden(
            f"roles {list(ctx.roles)} may not send Cypher in team {ctx.team_id!r}",
            "cypher_not_granted",
            field="cypher",
            hint="use a named intent (GET /graph/intents), or a credential with one of "
            f"{', '.join(ctx.policy.cypher_roles) or 'no role'}",
        )
    why = (
        "some doc types are not granted to your roles"
        if ctx.allowed_doc_types is not None
        else ctx.policy.restriction(ctx.team_id, ctx.roles, ctx.groups, ctx.permissions)
    )
    if why:
        raise forbidden(
            f"Cypher needs access to everything of team {ctx.team_id!r} in your visibility; {why}",
            "cypher_restricted_by_policy",
            field="cypher",
            hint="use a named intent (GET /graph/intents): they apply your policies",
        )


async def check_cypher_acl(ctx: AccessContext, graph: GraphStore) -> None:
    """Raises Forbidden when the team holds a document in the caller's visibility whose
    access list does not admit the caller (``GraphStore.acl_hidden``): the plan check
    cannot prove the ACL predicate, so such a caller uses the intents, which carry it.
    Call after ``check_cypher``."""
    if await graph.acl_hidden(graph_scope(ctx)):
        raise forbidden(
            f"Cypher needs access to everything of team {ctx.team_id!r} in your visibility; "
            "some documents' access lists do not admit you",
            "cypher_restricted_by_policy",
            field="cypher",
            hint="use a named intent (GET /graph/intents): they apply document access lists",
        )


def check_graph_write(ctx: AccessContext, visibilities: Sequence[str]) -> None:
    """Raises Forbidden unless the roles may write, and may write confidential entities
    when any is confidential (the request's mode must be confidential too)."""
    if not ctx.policy.may_write(ctx.roles):
        raise forbidden(
            f"roles {list(ctx.roles)} may not write to team {ctx.team_id!r}",
            "write_not_granted",
            field="team_id",
            hint=f"use a credential with one of {', '.join(ctx.policy.write_roles)}",
        )
    if any(v not in ctx.allowed_visibilities for v in visibilities):
        raise forbidden(
            "confidential entities need mode 'confidential' and a role that grants it",
            "confidential_not_granted",
            field="visibility",
        )


def out_of_reach(ctx: AccessContext, refused: Sequence[dict]) -> Forbidden:
    """The 403 of a write that would touch existing entities outside the writer's scope
    (nothing was written). Writers learn that these ids are taken; readers never do."""
    names = ", ".join(
        f"{r['label']} {r['id']!r}"
        if "label" in r
        else f"{r['type']} {r['from_id']!r}->{r['to_id']!r}"
        for r in refused[:10]
    )
    return forbidden(
        f"the write would change entities of team {ctx.team_id!r} outside what you may "
        f"write: {names}; nothing was written",
        "entity_out_of_reach",
        field="nodes",
        hint="an existing entity is written only by a caller who may see it: its visibility "
        "(mode 'confidential' with a role that grants it) and, for one documents made, one "
        "of those documents",
    )


def may_see_entity(ctx: AccessContext, entity: dict) -> bool:
    """Whether a graph node or relationship (as the graph store serialises them) is
    inside this scope: team and visibility; for documents also their access list (a node
    without one is open), doc type, project and skill policies; for projects the project
    policy."""
    if entity.get("team_id") != ctx.team_id:
        return False
    if entity.get("visibility") not in ctx.allowed_visibilities:
        return False
    labels = entity.get("labels") or ()
    if "Doc" in labels:
        if not acl.admits(
            tuple(entity.get("acl_allow") or ()),
            tuple(entity.get("acl_deny") or ()),
            ctx.acl_principals,
        ):
            return False
        doc_type = entity.get("doc_type") or ""
        if ctx.allowed_doc_types is not None and doc_type not in ctx.allowed_doc_types:
            return False
        return ctx.policy.resource_decision(
            ctx.team_id,
            entity.get("project_id") or "",
            entity.get("id") or "",
            tuple(entity.get("tags") or ()),
            ctx.roles,
            ctx.groups,
            ctx.permissions,
        ).allowed
    if "Project" in labels:
        return ctx.policy.project_decision(
            ctx.team_id, entity.get("id") or "", ctx.roles, ctx.groups, ctx.permissions
        ).allowed
    return True


def may_see_value(ctx: AccessContext, value: object) -> bool:
    """Every node, relationship and path inside a returned value is visible."""
    if isinstance(value, dict):
        kind = value.get("_type")
        if kind in ("node", "relationship") and not may_see_entity(ctx, value):
            return False
        return all(may_see_value(ctx, v) for v in value.values())
    if isinstance(value, list):
        return all(may_see_value(ctx, v) for v in value)
    return True
