"""The verified identity of a caller, and how it is read from token claims."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from deployments.errors import Unauthorized
from serve_app.settings import ClaimNames

AuthMethod = Literal["jwt", "api_key", "dev"]
# What a team id, role, group, permission or agent id in a credential may look like: the
# same bounds as identifiers in requests (no control characters, at most 256 characters).
_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")
# More entries than this in one claim is not an identity but an attack on the parser.
MAX_CLAIM_ITEMS = 1000


@dataclass(frozen=True)
class Principal:
    """Who is calling, as proven by a token or an API key.

    ``teams`` maps each team the identity grants to the caller's roles in it. A ``dev``
    principal (development body trust, no credential sent) has no teams of its own: it holds
    ``body_trust_roles`` in whichever team the request names.
    """

    sub: str
    method: AuthMethod
    teams: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    groups: frozenset[str] = frozenset()
    permissions: frozenset[str] = frozenset()
    agent_id: str = ""
    # The API key's public id, for logs and the audit trail.
    key_id: str = ""
    body_trust_roles: tuple[str, ...] = ()

    @property
    def trusts_body(self) -> bool:
        return self.method == "dev"

    def roles_in(self, team_id: str) -> tuple[str, ...]:
        """The caller's roles in ``team_id``; empty when the identity does not grant it."""
        if self.trusts_body:
            return self.body_trust_roles
        return self.teams.get(team_id, ())

    @classmethod
    def development(cls, roles: list[str] | tuple[str, ...]) -> Principal:
        return cls(sub="", method="dev", body_trust_roles=tuple(roles))


def claim(claims: Mapping[str, Any], path: str) -> Any:
    """``claims[path]``, else the dotted ``path`` walked through nested objects, else None."""
    if path in claims:
        return claims[path]
    node: Any = claims
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _invalid(name: str, problem: str) -> Unauthorized:
    return Unauthorized(
        f"token claim {name!r} {problem}",
        hint="ask the identity provider for a token with a well-formed claim",
    )


def _name(value: Any, claim_name: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise _invalid(claim_name, "holds a value that is not a name (1-256 printable characters)")
    return value


def _names(value: Any, claim_name: str, *, split: bool = False) -> tuple[str, ...]:
    """A list of names; ``None`` is empty; a string is one name (or space-separated ones)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split() if split else [value]
    if not isinstance(value, list | tuple):
        raise _invalid(claim_name, f"must be a list of strings, not {type(value).__name__}")
    if len(value) > MAX_CLAIM_ITEMS:
        raise _invalid(claim_name, f"has more than {MAX_CLAIM_ITEMS} entries")
    return tuple(dict.fromkeys(_name(v, claim_name) for v in value))


def parse_teams(
    raw: Any, claim_name: str, fallback_roles: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """Teams and roles from any of the accepted claim shapes.

    ``{"dao_a": ["member"], "dao_b": "owner"}``, ``["dao_a", "dao_b"]``, ``"dao_a"`` or
    ``[{"id": "dao_a", "roles": ["member"]}]``. A team listed without roles gets
    ``fallback_roles``.
    """
    if raw is None:
        return {}
    if isinstance(raw, str):
        raw = [raw]
    pairs: list[tuple[Any, Any]] = []
    if isinstance(raw, Mapping):
        pairs = list(raw.items())
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, Mapping):
                team = item.get("id", item.get("team_id"))
                pairs.append((team, item.get("roles")))
            else:
                pairs.append((item, None))
    else:
        raise _invalid(claim_name, f"has an unsupported shape ({type(raw).__name__})")
    if len(pairs) > MAX_CLAIM_ITEMS:
        raise _invalid(claim_name, f"has more than {MAX_CLAIM_ITEMS} entries")
    teams: dict[str, tuple[str, ...]] = {}
    for team, roles in pairs:
        team_id = _name(team, claim_name)
        granted = _names(roles, claim_name) or fallback_roles
        teams[team_id] = tuple(dict.fromkeys(teams.get(team_id, ()) + granted))
    return teams


def principal_from_claims(
    claims: Mapping[str, Any], names: ClaimNames, default_team_roles: list[str]
) -> Principal:
    """Build the identity from verified claims.

    Raises:
        Unauthorized: a claim has the wrong type or shape (the token is not usable).
    """
    sub = _name(claim(claims, names.subject), names.subject)
    global_roles = _names(claim(claims, names.roles), names.roles)
    teams = parse_teams(
        claim(claims, names.teams), names.teams, global_roles or tuple(default_team_roles)
    )
    agent = claim(claims, names.agent_id)
    return Principal(
        sub=sub,
        method="jwt",
        teams=teams,
        groups=frozenset(_names(claim(claims, names.groups), names.groups)),
        permissions=frozenset(
            _names(claim(claims, names.permissions), names.permissions, split=True)
        ),
        agent_id="" if agent in (None, "") else _name(agent, names.agent_id),
    )
