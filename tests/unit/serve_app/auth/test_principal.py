"""Principal: the identity read from verified claims, in every accepted claim shape."""

from __future__ import annotations

import pytest

from deployments.errors import Unauthorized
from serve_app.auth.principal import Principal, principal_from_claims
from serve_app.settings import ClaimNames

NAMES = ClaimNames()


def principal(claims: dict, names: ClaimNames = NAMES, default=("member",)) -> Principal:
    return principal_from_claims({"sub": "alice", **claims}, names, list(default))


def test_teams_as_a_mapping_of_roles():
    p = principal({"teams": {"dao_a": ["owner", "member"], "dao_b": "guest"}})
    assert dict(p.teams) == {"dao_a": ("owner", "member"), "dao_b": ("guest",)}


def test_teams_as_a_list_take_the_roles_claim():
    p = principal({"teams": ["dao_a", "dao_b"], "roles": ["guardian"]})
    assert dict(p.teams) == {"dao_a": ("guardian",), "dao_b": ("guardian",)}


def test_teams_as_a_list_without_roles_get_the_default_roles():
    assert dict(principal({"teams": ["dao_a"]}).teams) == {"dao_a": ("member",)}


def test_teams_as_objects_and_a_single_string():
    p = principal({"teams": [{"id": "dao_a", "roles": ["owner"]}, {"team_id": "dao_b"}]})
    assert dict(p.teams) == {"dao_a": ("owner",), "dao_b": ("member",)}
    assert dict(principal({"teams": "dao_c"}).teams) == {"dao_c": ("member",)}


def test_no_teams_claim_grants_no_team():
    p = principal({})
    assert dict(p.teams) == {}
    assert p.roles_in("dao_a") == ()


def test_groups_permissions_and_agent_id():
    p = principal(
        {
            "groups": ["platform-team"],
            "permissions": "memory:read skill:read",
            "agent_id": "ag_daarwizz",
        }
    )
    assert p.groups == {"platform-team"}
    assert p.permissions == {"memory:read", "skill:read"}
    assert p.agent_id == "ag_daarwizz"
    assert p.method == "jwt"


def test_claim_names_can_be_namespaced_or_dotted_paths():
    names = ClaimNames(
        teams="https://rag.example.org/teams",
        roles="realm_access.roles",
        groups="resource_access.rag.groups",
    )
    p = principal(
        {
            "https://rag.example.org/teams": ["dao_a"],
            "realm_access": {"roles": ["guardian"]},
            "resource_access": {"rag": {"groups": ["ops"]}},
        },
        names,
    )
    assert dict(p.teams) == {"dao_a": ("guardian",)}
    assert p.groups == {"ops"}


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": 42},
        {"sub": ""},
        {"sub": None},
        {"sub": "a\x00b"},
        {"teams": 5},
        {"teams": [5]},
        {"teams": {"dao_a": 5}},
        {"teams": {"dao_a": [None]}},
        {"teams": {"": ["owner"]}},
        {"teams": [{"id": ["dao_a"]}]},
        {"teams": {"x" * 300: ["owner"]}},
        {"teams": {f"t{i}": ["member"] for i in range(1001)}},
        {"groups": {"a": 1}},
        {"groups": [["nested"]]},
        {"permissions": 3.5},
        {"roles": [True]},
        {"agent_id": ["ag"]},
        {"agent_id": 7},
    ],
    ids=lambda c: repr(c)[:40],
)
def test_claims_of_the_wrong_type_are_refused_as_unauthorized(claims):
    with pytest.raises(Unauthorized, match="token claim"):
        principal(claims)


def test_development_principal_holds_its_roles_in_any_team():
    p = Principal.development(["owner"])
    assert p.trusts_body
    assert p.roles_in("whatever") == ("owner",)
