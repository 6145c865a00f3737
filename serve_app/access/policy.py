"""The access policy: which roles see confidential chunks, which doc types each role may read,
who may write, and resource policies of projects and shared skills.

It is read from YAML (``auth.policy_file``; the packaged ``serve_app/access/policy.yaml`` by
default) once per replica. Resource policies (docs/auth.md) follow the specification's wiki RBAC: an
``access_level`` (private / group / public) decided on the caller's groups, then a
``required_role`` and a ``required_permission``, each decision with a reason code.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

logger = logging.getLogger(__name__)

DEFAULT_POLICY_FILE = Path(__file__).with_name("policy.yaml")
ALL_DOC_TYPES = "*"
# A chunk tagged "skill:<id>" belongs to the shared skill <id> (as does a chunk whose doc_id
# is a skill id).
SKILL_TAG_PREFIX = "skill:"


class Decision(NamedTuple):
    allowed: bool
    # Short code for the caller and the audit log: access_level_public, in_allowed_group, ...
    reason: str


# A chunk whose project and skills (if any) all allow the caller.
ALLOWED = Decision(True, "team_member")


class ResourcePolicy(BaseModel):
    """Who may read one project or shared skill (the ``_access.yaml`` of the spec)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str = Field(min_length=1, validation_alias=AliasChoices("id", "project", "skill", "name"))
    # The team the resource belongs to; None = the same policy in every team.
    team_id: str | None = None
    owner_group: str | None = Field(None, validation_alias=AliasChoices("owner_group", "owner"))
    access_level: Literal["private", "group", "public"] = "private"
    allowed_groups: list[str] = Field(default_factory=list)
    required_role: str | None = None
    required_permission: str | None = None

    def decide(
        self, roles: Collection[str], groups: Collection[str], permissions: Collection[str]
    ) -> Decision:
        """The spec's order: access level, then the role requirement, then the permission."""
        if self.access_level == "public":
            decision = Decision(True, "access_level_public")
        elif self.access_level == "private":
            allowed = self.owner_group is not None and self.owner_group in groups
            decision = Decision(allowed, "owner_group" if allowed else "not_in_owner_group")
        else:
            allowed = any(g in groups for g in self.allowed_groups)
            decision = Decision(allowed, "in_allowed_group" if allowed else "not_in_allowed_groups")
        if self.required_role is not None and self.required_role not in roles:
            decision = Decision(False, f"role_requirement_failed: need {self.required_role}")
        if self.required_permission is not None and self.required_permission not in permissions:
            decision = Decision(False, f"permission_required: {self.required_permission}")
        return decision


def _index(entries: list[ResourcePolicy], kind: str) -> dict[tuple[str | None, str], Any]:
    index: dict[tuple[str | None, str], ResourcePolicy] = {}
    for entry in entries:
        key = (entry.team_id, entry.id)
        if key in index:
            scope = f"team {entry.team_id!r}" if entry.team_id else "every team"
            raise ValueError(f"{kind} {entry.id!r} has two policies for {scope}")
        index[key] = entry
    return index


class Policy(BaseModel):
    """The whole policy file. Role names are the per-team roles of the caller's identity."""

    model_config = ConfigDict(extra="forbid")

    # Roles whose holders may search in mode/visibility "confidential" and ingest confidential
    # documents.
    confidential_roles: list[str] = Field(default_factory=lambda: ["owner", "guardian"])
    # Roles that may ingest documents into their team.
    write_roles: list[str] = Field(default_factory=lambda: ["owner", "guardian", "service"])
    # Roles that may send their own read-only Cypher to graph.query_context (named intents
    # are open to every member of the team).
    cypher_roles: list[str] = Field(default_factory=lambda: ["owner", "guardian"])
    # role -> doc types it may read and write; "*" = all. A role not listed grants none.
    doc_types: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "owner": [ALL_DOC_TYPES],
            "guardian": [ALL_DOC_TYPES],
            "service": [ALL_DOC_TYPES],
            "member": ["message", "doc", "file", "wiki", "rwa"],
            "guest": ["doc", "wiki"],
        }
    )
    # A project id (or skill:<id> tag) without a policy: readable by every member of the team
    # ("allow") or by nobody ("deny").
    unlisted_resources: Literal["allow", "deny"] = "allow"
    projects: list[ResourcePolicy] = Field(default_factory=list)
    skills: list[ResourcePolicy] = Field(default_factory=list)
    _projects: dict = PrivateAttr(default_factory=dict)
    _skills: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _unique_resources(self) -> Policy:
        self._projects = _index(self.projects, "project")
        self._skills = _index(self.skills, "skill")
        return self

    # --- roles -----------------------------------------------------------------------------
    def sees_confidential(self, roles: Iterable[str]) -> bool:
        return any(r in self.confidential_roles for r in roles)

    def may_write(self, roles: Iterable[str]) -> bool:
        return any(r in self.write_roles for r in roles)

    def may_send_cypher(self, roles: Iterable[str]) -> bool:
        return any(r in self.cypher_roles for r in roles)

    def doc_types_for(self, roles: Iterable[str]) -> frozenset[str] | None:
        """The doc types the roles together may read; ``None`` means every doc type."""
        allowed: set[str] = set()
        for role in roles:
            types = self.doc_types.get(role, ())
            if ALL_DOC_TYPES in types:
                return None
            allowed.update(types)
        return frozenset(allowed)

    # --- resources -------------------------------------------------------------------------
    def resources_open(self) -> bool:
        """Whether every project and skill is readable by every member of a team: no project
        or skill policy, and unlisted resources allowed (``resource_decision`` always
        allows)."""
        return not self._projects and not self._skills and self.unlisted_resources == "allow"

    @staticmethod
    def _lookup(index: dict, team_id: str, resource_id: str) -> ResourcePolicy | None:
        return index.get((team_id, resource_id)) or index.get((None, resource_id))

    def _decide(
        self,
        entry: ResourcePolicy | None,
        roles: Collection[str],
        groups: Collection[str],
        permissions: Collection[str],
    ) -> Decision:
        if entry is None:
            allowed = self.unlisted_resources == "allow"
            return Decision(allowed, "unlisted_allowed" if allowed else "unlisted_denied")
        return entry.decide(roles, groups, permissions)

    def project_decision(
        self,
        team_id: str,
        project_id: str,
        roles: Collection[str],
        groups: Collection[str],
        permissions: Collection[str],
    ) -> Decision:
        entry = self._lookup(self._projects, team_id, project_id)
        return self._decide(entry, roles, groups, permissions)

    def skill_ids(self, team_id: str, doc_id: str, tags: Iterable[str]) -> list[str]:
        """The shared skills a chunk belongs to: its doc_id if a skill has a policy under that
        id, and every ``skill:<id>`` tag."""
        found = [doc_id] if self._lookup(self._skills, team_id, doc_id) is not None else []
        found += [
            t[len(SKILL_TAG_PREFIX) :]
            for t in tags
            if t.startswith(SKILL_TAG_PREFIX) and len(t) > len(SKILL_TAG_PREFIX)
        ]
        return found

    def resource_decision(
        self,
        team_id: str,
        project_id: str,
        doc_id: str,
        tags: Iterable[str],
        roles: Collection[str],
        groups: Collection[str],
        permissions: Collection[str],
    ) -> Decision:
        """Whether a caller may see a chunk of ``project_id`` / document ``doc_id``: the
        project's policy and the policy of every skill it belongs to must allow it."""
        # With no policy of a kind and unlisted resources allowed, that kind never denies.
        strict = self.unlisted_resources != "allow"
        if project_id and (self._projects or strict):
            decision = self.project_decision(team_id, project_id, roles, groups, permissions)
            if not decision.allowed:
                return decision
        if not (self._skills or strict):
            return ALLOWED
        for skill in self.skill_ids(team_id, doc_id, tags):
            entry = self._lookup(self._skills, team_id, skill)
            decision = self._decide(entry, roles, groups, permissions)
            if not decision.allowed:
                return Decision(False, f"skill {skill}: {decision.reason}")
        return ALLOWED

    # --- graph -----------------------------------------------------------------------------
    def _listed(self, index: dict, team_id: str) -> dict[str, ResourcePolicy]:
        """The policies that apply in ``team_id``, by resource id (a team's own entry wins)."""
        out = {rid: e for (team, rid), e in index.items() if team is None}
        out |= {rid: e for (team, rid), e in index.items() if team == team_id}
        return out

    def graph_params(
        self,
        team_id: str,
        roles: Collection[str],
        groups: Collection[str],
        permissions: Collection[str],
        doc_types: frozenset[str] | None,
    ) -> dict[str, Any]:
        """The resource policies of one caller as Cypher parameters, for the predicates the
        intent templates put on every ``Doc`` and ``Project`` (deployments/graph_store/intents.py,
        ``doc_allowed``/``project_allowed``): ``doc_types`` (null = all); ``projects_deny`` +
        ``projects`` (the listed projects the caller may not read, or, when unlisted ones are
        denied, those it may); ``denied_skill_ids``; ``skill_tags_deny`` + ``skill_tags`` (the
        ``skill:<id>`` tags denied, or the only ones allowed)."""
        unlisted_allowed = self.unlisted_resources == "allow"
        projects = self._listed(self._projects, team_id)
        skills = self._listed(self._skills, team_id)
        allowed_projects = {
            r for r, e in projects.items() if e.decide(roles, groups, permissions).allowed
        }
        allowed_skills = {
            r for r, e in skills.items() if e.decide(roles, groups, permissions).allowed
        }
        denied_skills = sorted(set(skills) - allowed_skills)
        return {
            "doc_types": sorted(doc_types) if doc_types is not None else None,
            "projects_deny": unlisted_allowed,
            "projects": sorted(set(projects) - allowed_projects)
            if unlisted_allowed
            else sorted(allowed_projects),
            "denied_skill_ids": denied_skills,
            "skill_tags_deny": unlisted_allowed,
            "skill_tags": [
                SKILL_TAG_PREFIX + s
                for s in (denied_skills if unlisted_allowed else sorted(allowed_skills))
            ],
        }

    def restriction(
        self,
        team_id: str,
        roles: Collection[str],
        groups: Collection[str],
        permissions: Collection[str],
    ) -> str | None:
        """Why a caller sees less than every document of its team and visibility (a project
        or skill policy denies it something), or None."""
        if self.unlisted_resources == "deny":
            return "unlisted projects and skills are denied by the policy"
        for kind, index in (("project", self._projects), ("skill", self._skills)):
            for rid, entry in sorted(self._listed(index, team_id).items()):
                decision = entry.decide(roles, groups, permissions)
                if not decision.allowed:
                    return f"{kind} {rid!r} is denied ({decision.reason})"
        return None

    # --- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path = "") -> Policy:
        """Read and validate a policy file; ``""`` reads the packaged default.

        Raises:
            ValueError: naming the file when it is missing, not YAML or not a valid policy.
        """
        file = Path(path) if path else DEFAULT_POLICY_FILE
        try:
            raw = yaml.safe_load(file.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"policy file {file}: {exc}") from exc
        try:
            policy = cls.model_validate(raw or {})
        except ValidationError as exc:
            raise ValueError(f"policy file {file}: {exc}") from exc
        logger.info(
            "policy %s: %d project and %d skill policies",
            file,
            len(policy.projects),
            len(policy.skills),
        )
        return policy
