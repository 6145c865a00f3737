"""AccessContext: who is asking, for which tenant, and what they may see.

It is built only from the verified ``Principal`` plus the request's ``team_id`` (which the
identity must grant, else 403), and it is the only place Milvus filters (``SearchFilter``) are
built from. Fields of the request body (``user_id``, ``agent_id``, ``mode``/``visibility``,
``filters``) can only narrow what the identity grants, never widen it. A ``dev`` principal
(development body trust, no credential) holds ``auth.dev_roles`` in whatever team the body
names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property

from batch_ingest.documents import SourceDocument
from deployments import acl
from deployments.errors import Forbidden
from deployments.protocols import ChunkRecord, SearchFilter
from serve_app.access.policy import Policy
from serve_app.auth.principal import Principal
from serve_app.contracts import SearchFilters

VISIBILITY_SCOPE = {
    "public": ("public",),
    "confidential": ("public", "confidential"),
}
DEV_SUBJECT = "dev"


def forbidden(
    message: str, reason: str, *, field: str | None = None, hint: str | None = None
) -> Forbidden:
    return Forbidden(message, reason=reason, field=field, hint=hint)


@dataclass(frozen=True)
class AccessContext:
    """The caller's scope in one team. Build it with ``for_team``/``for_caller``; direct
    construction is for tests and trusted code."""

    team_id: str
    user_id: str = ""
    # The verified agent id (token claim or API key); empty for a user without one.
    agent_id: str = ""
    allowed_visibilities: tuple[str, ...] = ("public",)
    roles: tuple[str, ...] = ()
    groups: frozenset[str] = frozenset()
    permissions: frozenset[str] = frozenset()
    # Doc types the roles may read; None = every doc type.
    allowed_doc_types: frozenset[str] | None = None
    policy: Policy = field(default_factory=Policy, repr=False, compare=False)
    auth_method: str = ""
    # The agent id a caller without a verified one put in the body: recorded, never trusted.
    declared_agent_id: str = ""

    # --- building --------------------------------------------------------------------------
    @classmethod
    def for_team(
        cls,
        principal: Principal,
        team_id: str,
        policy: Policy,
        *,
        user_id: str = "",
        agent_id: str = "",
        field_name: str = "team_id",
    ) -> AccessContext:
        """The caller's context in ``team_id`` with every right the identity grants there.

        Raises:
            Forbidden: the identity does not grant ``team_id``, or the body's ``user_id`` /
                ``agent_id`` names someone else than the identity.
        """
        roles = principal.roles_in(team_id)
        if not roles:
            granted = sorted(principal.teams)
            listed = ", ".join(granted[:20]) + (", ..." if len(granted) > 20 else "")
            raise forbidden(
                f"team {team_id!r} is not granted to this caller",
                "team_not_granted",
                field=field_name,
                hint=f"use a team your credential grants: {listed or 'none'}",
            )
        if principal.trusts_body:
            subject, verified_agent, declared = user_id or DEV_SUBJECT, agent_id, ""
        else:
            if user_id and user_id != principal.sub:
                raise forbidden(
                    f"user_id {user_id!r} is not the authenticated subject",
                    "user_id_mismatch",
                    field="user_id",
                    hint="omit user_id or send the subject of your token",
                )
            if principal.agent_id and agent_id and agent_id != principal.agent_id:
                raise forbidden(
                    f"agent_id {agent_id!r} is not the authenticated agent",
                    "agent_id_mismatch",
                    field="agent_id",
                    hint=f"omit agent_id or send {principal.agent_id!r}",
                )
            subject, verified_agent = principal.sub, principal.agent_id
            declared = "" if principal.agent_id else agent_id
        return cls(
            team_id=team_id,
            user_id=subject,
            agent_id=verified_agent,
            allowed_visibilities=VISIBILITY_SCOPE[
                "confidential" if policy.sees_confidential(roles) else "public"
            ],
            roles=roles,
            groups=principal.groups,
            permissions=principal.permissions,
            allowed_doc_types=policy.doc_types_for(roles),
            policy=policy,
            auth_method=principal.method,
            declared_agent_id=declared,
        )

    @classmethod
    def for_caller(
        cls,
        principal: Principal,
        policy: Policy,
        *,
        team_id: str,
        user_id: str = "",
        agent_id: str = "",
        visibility: str = "public",
    ) -> AccessContext:
        """The context of one read (a search, an enrich, a graph call): the team's rights
        narrowed to the privacy mode ``visibility``.

        Raises:
            Forbidden: the team is not granted, the body names another user or agent than
                the identity, or ``visibility`` asks for confidential chunks the caller's
                roles do not grant.
        """
        ctx = cls.for_team(principal, team_id, policy, user_id=user_id, agent_id=agent_id)
        return ctx.narrowed_to(visibility)

    def narrowed_to(self, visibility: str) -> AccessContext:
        """This context limited to the privacy mode ``visibility`` (public / confidential)."""
        if visibility not in self.allowed_visibilities:
            raise forbidden(
                f"mode/visibility {visibility!r} is not granted to roles {list(self.roles)} "
                f"in team {self.team_id!r}",
                "confidential_not_granted",
                field="visibility",
                hint="send mode 'public', or use a credential with a role that sees "
                f"confidential data ({', '.join(self.policy.confidential_roles)})",
            )
        scope = VISIBILITY_SCOPE[visibility]
        return replace(self, allowed_visibilities=scope)

    def scope_key(self) -> tuple[object, ...]:
        """Everything of this context that decides what the caller may see, as a stable
        value (the semantic cache's bucket): two contexts with different keys never share a
        cached answer."""
        return (
            self.team_id,
            self.user_id,
            self.agent_id,
            tuple(sorted(self.allowed_visibilities)),
            tuple(sorted(self.roles)),
            tuple(sorted(self.groups)),
            tuple(sorted(self.permissions)),
            None if self.allowed_doc_types is None else tuple(sorted(self.allowed_doc_types)),
            self.auth_method,
        )

    @cached_property
    def acl_principals(self) -> tuple[str, ...]:
        """The caller's document-ACL tokens: its subject and its verified groups."""
        return acl.principal_tokens(self.user_id, self.groups)

    # Computed once per context (per request), read for every candidate chunk by ``may_see``.
    @cached_property
    def _held(self) -> frozenset[str]:
        return frozenset(self.acl_principals)

    @cached_property
    def _resources_open(self) -> bool:
        return self.policy.resources_open()

    # --- searching -------------------------------------------------------------------------
    def search_filter(self, filters: SearchFilters) -> SearchFilter:
        """Compile validated request filters inside this context's scope. Checks resource
        policies first, so a denied project is refused before any search.

        Raises:
            Forbidden: a visibility outside the scope, doc types none of which the roles
                grant, or a project whose policy denies the caller.
        """
        visibilities = self.allowed_visibilities
        if filters.visibility is not None:
            if filters.visibility not in self.allowed_visibilities:
                raise forbidden(
                    f"filters.visibility={filters.visibility!r} is outside this caller's scope "
                    f"{list(self.allowed_visibilities)}",
                    "confidential_not_granted",
                    hint="send mode/visibility 'confidential' with a role that grants it",
                    field="filters.visibility",
                )
            visibilities = (filters.visibility,)
        if filters.project_id:
            decision = self.policy.project_decision(
                self.team_id, filters.project_id, self.roles, self.groups, self.permissions
            )
            if not decision.allowed:
                raise forbidden(
                    f"project {filters.project_id!r} is not accessible: {decision.reason}",
                    decision.reason,
                    field="filters.project_id",
                    hint="search a project your groups, roles and permissions grant",
                )
        return SearchFilter(
            team_id=self.team_id,
            visibilities=visibilities,
            project_id=filters.project_id or None,
            channel_id=filters.channel_id or None,
            agent_id=filters.agent_id or None,
            doc_types=self._doc_types(filters.doc_type or ()),
            tags_any=tuple(filters.tags or ()) if filters.tags_mode == "any" else (),
            tags_all=tuple(filters.tags or ()) if filters.tags_mode == "all" else (),
            created_from=filters.created_from,
            created_to=filters.created_to,
            acl_principals=self.acl_principals,
        )

    def _doc_types(self, requested: list[str] | tuple[str, ...]) -> tuple[str, ...]:
        """Requested doc types intersected with the roles' (empty tuple = no restriction).
        Asking for some types the roles lack drops them; asking only for such types is 403."""
        if self.allowed_doc_types is None:
            return tuple(requested)
        granted = sorted(self.allowed_doc_types)
        wanted = [d for d in requested if d in self.allowed_doc_types] if requested else granted
        if not wanted:
            raise forbidden(
                f"doc types {list(requested) or 'any'} are not granted to roles "
                f"{list(self.roles)} in team {self.team_id!r}",
                "doc_type_not_granted",
                field="filters.doc_type",
                hint=f"ask for {', '.join(granted)}" if granted else "use another credential",
            )
        return tuple(dict.fromkeys(wanted))

    def may_see(self, chunk: ChunkRecord) -> bool:
        """Whether a stored chunk is inside this scope: the result filter behind every store
        filter (team, visibility, doc type, document ACL, project and skill policies)."""
        return self.may_see_each((chunk,))[0]

    def may_see_each(self, chunks: Iterable[ChunkRecord]) -> list[bool]:
        """``may_see`` of each chunk, in order; what the rule reads of this context is read
        once (a search's result filter judges ~200 chunks)."""
        team_id, visibilities = self.team_id, self.allowed_visibilities
        doc_types, held = self.allowed_doc_types, self._held
        resources_open = self._resources_open
        admits_held = acl.admits_held
        verdicts = []
        for chunk in chunks:
            seen = (
                chunk.team_id == team_id
                and chunk.visibility in visibilities
                and (doc_types is None or chunk.doc_type in doc_types)
                and admits_held(chunk.acl_allow, chunk.acl_deny, held)
            )
            if seen and not resources_open:
                seen = self.policy.resource_decision(
                    team_id,
                    chunk.project_id,
                    chunk.doc_id,
                    chunk.tags,
                    self.roles,
                    self.groups,
                    self.permissions,
                ).allowed
            verdicts.append(seen)
        return verdicts

    # --- writing ---------------------------------------------------------------------------
    def check_write(self, doc: SourceDocument, where: str) -> None:
        """Whether this caller may ingest ``doc`` into its team.

        Raises:
            Forbidden: no write role, a doc type or visibility the roles do not grant, or a
                project whose policy denies the caller.
        """
        if not self.policy.may_write(self.roles):
            raise forbidden(
                f"{where}: roles {list(self.roles)} may not write to team {self.team_id!r}",
                "write_not_granted",
                field=f"{where}.team_id",
                hint=f"use a credential with one of {', '.join(self.policy.write_roles)}",
            )
        if self.allowed_doc_types is not None and doc.doc_type not in self.allowed_doc_types:
            raise forbidden(
                f"{where}: doc_type {doc.doc_type!r} is not granted to roles {list(self.roles)}",
                "doc_type_not_granted",
                field=f"{where}.doc_type",
            )
        if doc.visibility not in self.allowed_visibilities:
            raise forbidden(
                f"{where}: roles {list(self.roles)} may not write confidential documents",
                "confidential_not_granted",
                field=f"{where}.visibility",
            )
        decision = self.policy.resource_decision(
            self.team_id,
            doc.project_id,
            doc.doc_id,
            doc.tags,
            self.roles,
            self.groups,
            self.permissions,
        )
        if not decision.allowed:
            raise forbidden(
                f"{where}: project or skill not accessible: {decision.reason}",
                decision.reason,
                field=f"{where}.project_id",
            )


def check_ingest(
    principal: Principal, docs: list[SourceDocument], policy: Policy
) -> dict[str, AccessContext]:
    """Check every document before anything is written; one context per team.

    Raises:
        Forbidden: naming the first document the caller may not write.
    """
    contexts: dict[str, AccessContext] = {}
    for i, doc in enumerate(docs):
        where = f"documents.{i}"
        ctx = contexts.get(doc.team_id)
        if ctx is None:
            ctx = AccessContext.for_team(
                principal, doc.team_id, policy, field_name=f"{where}.team_id"
            )
            contexts[doc.team_id] = ctx
        ctx.check_write(doc, where)
    return contexts


# --- operator actions ---------------------------------------------------------------------------
@dataclass(frozen=True)
class OperatorRight:
    """An operator action outside the tool surface (reading the audit log, reindexing a
    team): granted by a permission, or by one of ``roles`` in the team it concerns."""

    action: str  # what is refused, as a sentence subject: "reindexing this team"
    subject: str  # what needs a verified identity in production: "reindex"
    permission: str
    roles: tuple[str, ...]
    denied: str  # the reason code of a refusal
    by_permission: str  # the audited reason of a grant by the permission
    by_role: str  # ... and by a role in the team
    where: str = "in the team"  # where the roles count, for the hint


def operator_scope(
    principal: Principal, team_id: str | None, right: OperatorRight, *, production: bool
) -> str:
    """Why ``principal`` may perform ``right`` for ``team_id`` (``None``: every team).

    Raises:
        Forbidden: neither the permission, nor one of the roles in ``team_id``, nor a
            development caller outside production.
    """
    if principal.trusts_body:
        if production:
            raise Forbidden(
                f"{right.subject} needs a verified identity in production", reason=right.denied
            )
        return "dev_mode"
    if right.permission in principal.permissions:
        return right.by_permission
    if team_id and set(principal.roles_in(team_id)) & set(right.roles):
        return right.by_role
    hint = f"a credential with the permission {right.permission!r}"
    if right.roles:
        hint += f", or one of the roles {list(right.roles)} {right.where}"
    raise Forbidden(
        f"{right.action} is not granted to this caller" + ("" if team_id else " for every team"),
        reason=right.denied,
        hint=hint,
    )
