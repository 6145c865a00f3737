"""The policy file: roles, doc types, and resource policies of projects and skills."""

from __future__ import annotations

import pytest

from serve_app.access.policy import DEFAULT_POLICY_FILE, Policy, ResourcePolicy

SPEC_POLICIES = """
projects:
  - project: poimen
    owner_group: platform-team
    access_level: group
    allowed_groups: [platform-team, devops-team]
    required_role: null
    required_permission: null
  - project: ai-infra
    owner_group: ml-team
    access_level: public
skills:
  - skill: SKILL-kubernetes-debugging
    owner_group: platform-team
    access_level: group
    allowed_groups: [platform-team, devops-team]
    required_permission: skill:read
  - skill: SKILL-private-debug
    owner_group: ml-team
    access_level: private
"""


@pytest.fixture
def policy(tmp_path) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(SPEC_POLICIES)
    return Policy.load(str(path))


def test_packaged_default_policy_loads():
    policy = Policy.load()
    assert DEFAULT_POLICY_FILE.exists()
    assert policy == Policy()


def test_spec_scenario_1_charlie_in_allowed_group_reads_poimen(policy):
    decision = policy.project_decision(
        "dao_x", "poimen", ["member"], {"platform-team", "devops-team"}, set()
    )
    assert decision == (True, "in_allowed_group")


def test_spec_scenario_2_alice_not_in_allowed_groups_is_denied(policy):
    decision = policy.project_decision("dao_x", "poimen", ["member"], {"data-team"}, set())
    assert decision == (False, "not_in_allowed_groups")


def test_spec_scenario_3_private_skill_of_another_group_is_denied(policy):
    decision = policy.resource_decision(
        "dao_x", "poimen", "SKILL-private-debug", (), ["member"], {"platform-team"}, set()
    )
    assert decision == (False, "skill SKILL-private-debug: not_in_owner_group")


def test_public_project_is_readable_by_anyone_in_the_team(policy):
    assert policy.project_decision("dao_x", "ai-infra", ["guest"], set(), set()).allowed


def test_required_permission_is_checked_after_the_group(policy):
    groups = {"devops-team"}
    denied = policy.resource_decision(
        "dao_x", "", "SKILL-kubernetes-debugging", (), ["member"], groups, set()
    )
    assert denied == (False, "skill SKILL-kubernetes-debugging: permission_required: skill:read")
    allowed = policy.resource_decision(
        "dao_x", "", "SKILL-kubernetes-debugging", (), ["member"], groups, {"skill:read"}
    )
    assert allowed.allowed


def test_skill_tag_marks_a_chunk_as_part_of_a_skill(policy):
    decision = policy.resource_decision(
        "dao_x", "", "notes", ["skill:SKILL-private-debug"], ["owner"], set(), set()
    )
    assert not decision.allowed


def test_required_role_overrides_group_membership():
    entry = ResourcePolicy(
        id="p", access_level="group", allowed_groups=["ops"], required_role="guardian"
    )
    assert entry.decide(["member"], {"ops"}, set()) == (
        False,
        "role_requirement_failed: need guardian",
    )
    assert entry.decide(["guardian"], {"ops"}, set()).allowed


def test_private_without_owner_group_denies_everyone():
    assert (
        not ResourcePolicy(id="p", access_level="private").decide(["owner"], {"x"}, set()).allowed
    )


def test_unlisted_projects_follow_unlisted_resources():
    assert Policy().project_decision("t", "anything", ["member"], set(), set()).allowed
    strict = Policy(unlisted_resources="deny")
    assert strict.project_decision("t", "anything", ["owner"], set(), set()) == (
        False,
        "unlisted_denied",
    )
    # A chunk without a project is not a resource of its own.
    assert strict.resource_decision("t", "", "doc", (), ["owner"], set(), set()).allowed


def test_resource_decisions_skip_only_what_can_never_deny():
    """The per-chunk shortcut (a kind without any policy never denies while unlisted
    resources are allowed) decides exactly what the full rules decide."""
    skill_tag = ("skill:s1",)
    open_policy = Policy()
    assert open_policy.resources_open()
    assert open_policy.resource_decision("t", "p", "d", skill_tag, ["guest"], set(), set()) == (
        True,
        "team_member",
    )
    strict = Policy(unlisted_resources="deny")
    assert not strict.resources_open()
    assert not strict.resource_decision("t", "", "d", skill_tag, ["owner"], set(), set()).allowed
    assert not strict.resource_decision("t", "p", "d", (), ["owner"], set(), set()).allowed
    # Projects listed, skills not: a skill tag still never denies; the project does.
    projects = Policy(projects=[{"project": "p", "access_level": "private"}])
    assert not projects.resources_open()
    assert projects.resource_decision("t", "q", "d", skill_tag, ["member"], set(), set()).allowed
    denied = projects.resource_decision("t", "p", "d", skill_tag, ["member"], set(), set())
    assert not denied.allowed
    # Skills listed, projects not: an unlisted project never denies; the skill does.
    skills = Policy(skills=[{"skill": "s1", "access_level": "private"}])
    assert not skills.resource_decision("t", "q", "d", skill_tag, ["member"], set(), set()).allowed
    assert skills.resource_decision("t", "q", "d", (), ["member"], set(), set()).allowed


def test_team_specific_policy_wins_over_the_global_one():
    policy = Policy(
        projects=[
            {"project": "shared", "access_level": "public"},
            {"project": "shared", "team_id": "dao_b", "access_level": "private"},
        ]
    )
    assert policy.project_decision("dao_a", "shared", ["member"], set(), set()).allowed
    assert not policy.project_decision("dao_b", "shared", ["member"], set(), set()).allowed


def test_roles_grant_confidential_write_and_doc_types():
    policy = Policy()
    assert policy.sees_confidential(["member", "guardian"])
    assert not policy.sees_confidential(["member", "service"])
    assert policy.may_write(["service"]) and not policy.may_write(["member"])
    assert policy.doc_types_for(["guest"]) == {"doc", "wiki"}
    assert policy.doc_types_for(["guest", "owner"]) is None
    assert policy.doc_types_for(["unknown-role"]) == frozenset()


@pytest.mark.parametrize(
    "content",
    [
        "projects: [{project: p, access_level: secret}]",
        "projects: [{project: p}, {id: p}]",
        "colour: green",
        "doc_types: [doc]",
        "[unclosed",
    ],
)
def test_invalid_policy_file_is_refused_naming_the_file(tmp_path, content):
    path = tmp_path / "policy.yaml"
    path.write_text(content)
    with pytest.raises(ValueError, match="policy file"):
        Policy.load(str(path))


def test_missing_policy_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="policy file"):
        Policy.load(str(tmp_path / "absent.yaml"))
