"""serve_app.cli.vault: a Markdown vault → wiki documents, _access.yaml → policy file."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from batch_ingest.documents import DocumentAcl
from serve_app.access.policy import Policy
from serve_app.cli.vault import (
    AccessFileError,
    _payload,
    main,
    merge_policy,
    read_access,
    scan_vault,
    split_front_matter,
    write_policy,
)
from serve_app.testing import build_gateway, claims, mint

TEAM = "dao_vault"
MTIME = 1_700_000_000


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.utime(path, (MTIME, MTIME))
    return path


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    write(
        root,
        "projects/poimen/_access.yaml",
        "project: poimen\nowner: platform-team\naccess_level: group\n"
        "allowed_groups: [platform-team, devops-team]\nrequired_role: null\n",
    )
    write(
        root,
        "projects/poimen/index.md",
        "---\ntitle: Poimen overview\ntags: [k8s, ops]\ncreated: 2024-03-01\n"
        "visibility: confidential\n---\n# Poimen\n\nSee [[kubectl]] and "
        "[[SKILL-kubernetes-debugging|debugging]].\n",
    )
    write(
        root,
        "projects/poimen/tools/kubectl.md",
        "# Kubectl\n\nUse `[[not-a-link]]` with [[root-cause]] and [[Poimen overview]].\n",
    )
    write(root, "projects/poimen/memories/empty.md", "---\ntitle: Empty\n---\n   \n")
    write(root, "projects/ai-infra/_access.yaml", "project: ai-infra\nowner: ml-team\n"
          "access_level: public\n")  # fmt: skip
    write(root, "projects/ai-infra/index.md", "---\ntags: 'gpu, #training'\ndate: nonsense\n"
          "visibility: secret\n---\nNo heading here, links [[kubectl]].\n")  # fmt: skip
    write(
        root,
        "shared/skills/SKILL-kubernetes-debugging/_access.yaml",
        "skill: SKILL-kubernetes-debugging\nowner_group: platform-team\naccess_level: group\n"
        "allowed_groups: [platform-team]\nrequired_permission: skill:read\n",
    )
    write(
        root,
        "shared/skills/SKILL-kubernetes-debugging/SKILL.md",
        "---\ntitle: K8s debugging\ncreated: '2024-05-02T10:00:00Z'\n---\n"
        "## Steps\n\nCheck [[kubectl]] logs.\n",
    )
    write(root, "README.md", "# Vault readme\n\nTop-level note.\n")
    write(root, ".obsidian/workspace.md", "# should be skipped\n")
    write(root, "projects/poimen/.git/notes.md", "# also skipped\n")
    return root


def by_id(plan):
    return {d.doc_id: d for d in plan.documents}


# --- mapping -------------------------------------------------------------------------------


def test_notes_map_to_wiki_documents(vault):
    plan = scan_vault(vault, TEAM)
    docs = by_id(plan)
    assert sorted(docs) == [
        "README.md",
        "projects/ai-infra/index.md",
        "projects/poimen/index.md",
        "projects/poimen/tools/kubectl.md",
        "shared/skills/SKILL-kubernetes-debugging/SKILL.md",
    ]
    index = docs["projects/poimen/index.md"]
    assert index.team_id == TEAM and index.doc_type == "wiki"
    assert index.title == "Poimen overview"
    assert index.project_id == "poimen"
    assert index.tags == ["k8s", "ops"]
    assert index.visibility == "confidential"
    assert index.created_at == int(datetime(2024, 3, 1, tzinfo=UTC).timestamp())
    assert index.text.startswith("# Poimen\n") and "title:" not in index.text

    kubectl = docs["projects/poimen/tools/kubectl.md"]
    assert kubectl.title == "Kubectl" and kubectl.project_id == "poimen"
    assert kubectl.created_at == MTIME and kubectl.visibility == "public" and kubectl.tags == []

    infra = docs["projects/ai-infra/index.md"]
    assert infra.title == "index"  # no title, no heading: the file stem
    assert infra.tags == ["gpu", "training"]
    assert infra.created_at == MTIME  # unparseable date → mtime
    assert infra.visibility == "public"  # invalid visibility → the default

    skill = docs["shared/skills/SKILL-kubernetes-debugging/SKILL.md"]
    assert skill.project_id == ""
    assert skill.tags == ["skill:SKILL-kubernetes-debugging"]
    assert skill.created_at == int(datetime(2024, 5, 2, 10, tzinfo=UTC).timestamp())
    assert skill.title == "K8s debugging"

    assert docs["README.md"].project_id == "" and docs["README.md"].tags == []
    assert [rel for rel, _ in plan.skipped] == ["projects/poimen/memories/empty.md"]
    assert "text" in plan.skipped[0][1]


def test_links_are_counted_and_resolved(vault):
    plan = scan_vault(vault, TEAM)
    assert plan.links["projects/poimen/index.md"] == ("kubectl", "skill-kubernetes-debugging")
    assert plan.links["projects/poimen/tools/kubectl.md"] == ("root-cause", "poimen-overview")
    assert plan.link_count == 6
    # kubectl ×3 (file name), poimen-overview (title); the others point outside the vault
    assert plan.resolved_link_count() == 4
    assert plan.per_project() == {"poimen": 2, "ai-infra": 1}
    assert plan.per_skill() == {"SKILL-kubernetes-debugging": 1}


def test_default_visibility_and_front_matter_edge_cases(vault):
    plan = scan_vault(vault, TEAM, visibility="confidential")
    assert by_id(plan)["README.md"].visibility == "confidential"
    assert split_front_matter("no front matter\n---\n") == ({}, "no front matter\n---\n")
    assert split_front_matter("---\n---\nbody") == ({}, "body")
    with pytest.raises(ValueError, match="mapping"):
        split_front_matter("---\n- a list\n---\nbody")


def test_bad_front_matter_skips_only_that_note(vault):
    write(vault, "projects/poimen/broken.md", "---\ntitle: [unclosed\n---\nbody\n")
    plan = scan_vault(vault, TEAM)
    assert "projects/poimen/broken.md" in dict(plan.skipped)
    assert len(plan.documents) == 5


# --- access files and policy ---------------------------------------------------------------


def test_access_files_become_resource_policies(vault):
    plan = scan_vault(vault, TEAM)
    projects = {p.id: p for p in plan.projects}
    assert set(projects) == {"poimen", "ai-infra"}
    assert projects["poimen"].owner_group == "platform-team"
    assert projects["poimen"].allowed_groups == ["platform-team", "devops-team"]
    assert projects["poimen"].team_id == TEAM
    assert projects["ai-infra"].access_level == "public"
    (skill,) = plan.skills
    assert skill.id == "SKILL-kubernetes-debugging"
    assert skill.required_permission == "skill:read"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("project: poimen\naccess_level: secret\n", "access_level"),
        ("project: other\naccess_level: public\n", "'project'"),
        ("project: poimen\ncolour: red\n", "colour"),
        ("- a\n- list\n", "mapping"),
        ("project: [unclosed\n", "_access.yaml"),
    ],
)
def test_bad_access_file_names_file_and_field(tmp_path, content, needle):
    path = write(tmp_path, "projects/poimen/_access.yaml", content)
    with pytest.raises(AccessFileError) as exc:
        read_access(path, "poimen", TEAM)
    assert str(path) in str(exc.value) and needle in str(exc.value)


def test_policy_file_loads_and_decides(vault, tmp_path):
    out = tmp_path / "policy.yaml"
    policy = write_policy(out, scan_vault(vault, TEAM))
    assert Policy.load(out).model_dump() == policy.model_dump()
    member = policy.project_decision(TEAM, "poimen", ["member"], ["devops-team"], [])
    assert member == (True, "in_allowed_group")
    other = policy.project_decision(TEAM, "poimen", ["member"], ["data-team"], [])
    assert other == (False, "not_in_allowed_groups")
    assert policy.project_decision(TEAM, "ai-infra", ["member"], [], []).allowed
    # the policies are the importing team's only
    assert policy.project_decision("dao_other", "poimen", ["member"], [], []).reason == (
        "unlisted_allowed"
    )
    tags = ["skill:SKILL-kubernetes-debugging"]
    skill_doc = "shared/skills/SKILL-kubernetes-debugging/SKILL.md"
    ok = policy.resource_decision(TEAM, "", skill_doc, tags, [], ["platform-team"], ["skill:read"])
    assert ok.allowed
    no_perm = policy.resource_decision(TEAM, "", skill_doc, tags, [], ["platform-team"], [])
    assert not no_perm.allowed and "permission_required" in no_perm.reason


def test_merge_keeps_other_keys_and_entries(vault, tmp_path):
    out = tmp_path / "policy.yaml"
    out.write_text(
        yaml.safe_dump(
            {
                "cypher_roles": ["owner"],
                "unlisted_resources": "deny",
                "projects": [
                    {"project": "poimen", "team_id": TEAM, "access_level": "public"},
                    {"project": "poimen", "team_id": "dao_other", "access_level": "public"},
                    {"id": "legacy", "access_level": "private", "owner_group": "board"},
                ],
            }
        ),
        encoding="utf-8",
    )
    policy = write_policy(out, scan_vault(vault, TEAM))
    assert policy.cypher_roles == ["owner"] and policy.unlisted_resources == "deny"
    keys = sorted((p.team_id or "", p.id) for p in policy.projects)
    assert keys == [
        ("", "legacy"),
        ("dao_other", "poimen"),
        (TEAM, "ai-infra"),
        (TEAM, "poimen"),
    ]
    replaced = next(p for p in policy.projects if (p.team_id, p.id) == (TEAM, "poimen"))
    assert replaced.access_level == "group"
    # merging twice is stable
    again = write_policy(out, scan_vault(vault, TEAM))
    assert again.model_dump() == policy.model_dump()


def test_merge_from_scratch_starts_with_packaged_defaults(vault):
    merged = merge_policy(None, scan_vault(vault, TEAM))
    assert merged["write_roles"] == ["owner", "guardian", "service"]
    assert len(merged["projects"]) == 2 and len(merged["skills"]) == 1
    Policy.model_validate(merged)


# --- document ACLs ------------------------------------------------------------------------

STAFF = DocumentAcl(allowed_groups=["staff"])


@pytest.fixture
def acl_vault(vault: Path) -> Path:
    """The vault with ACLs: the root's, poimen's (beside its policy), poimen/tools' own."""
    write(vault, "_access.yaml", "acl:\n  allowed_groups: [staff]\n")
    write(
        vault,
        "projects/poimen/_access.yaml",
        "project: poimen\nowner: platform-team\naccess_level: group\n"
        "allowed_groups: [platform-team, devops-team]\n"
        "acl:\n  allowed_groups: [platform-team, sre, sre]\n  allowed_users: [carol]\n",
    )
    write(vault, "projects/poimen/tools/_access.yaml", "acl:\n  denied_groups: [contractors]\n")
    return vault


def acls(plan) -> dict[str, DocumentAcl | None]:
    return {d.doc_id: d.acl for d in plan.documents}


def test_folder_acls_are_inherited_nearest_wins(acl_vault):
    plan = scan_vault(acl_vault, TEAM)
    poimen = DocumentAcl(allowed_groups=["platform-team", "sre"], allowed_users=["carol"])
    assert acls(plan) == {
        "README.md": STAFF,  # the vault root's
        "projects/ai-infra/index.md": STAFF,  # a sibling of poimen: untouched by it
        "projects/poimen/index.md": poimen,
        # the nearest folder wins outright: neither poimen's nor the root's lists are merged in
        "projects/poimen/tools/kubectl.md": DocumentAcl(denied_groups=["contractors"]),
        "shared/skills/SKILL-kubernetes-debugging/SKILL.md": STAFF,
    }
    assert plan.acls["projects/poimen"].allowed_groups == ["platform-team", "sre"]  # sorted, once
    assert set(plan.acls) == {"", "projects/poimen", "projects/poimen/tools"}
    assert plan.acl_count == 5
    assert _payload(by_id(plan)["README.md"])["acl"] == {
        "allowed_groups": ["staff"],
        "allowed_users": [],
        "denied_groups": [],
    }


def test_vault_without_acls_sends_none(vault):
    plan = scan_vault(vault, TEAM)
    assert set(acls(plan).values()) == {None} and plan.acl_count == 0 and plan.acls == {}
    assert "acl" not in _payload(plan.documents[0])  # what gateways before ACLs accept


def test_empty_folder_acl_reopens_a_subtree(acl_vault):
    write(acl_vault, "projects/poimen/tools/_access.yaml", "acl: {}\n")
    docs = acls(scan_vault(acl_vault, TEAM))
    assert docs["projects/poimen/tools/kubectl.md"] is None
    assert docs["projects/poimen/index.md"] is not None and docs["README.md"] == STAFF


def test_front_matter_acl_overrides_the_folders(acl_vault):
    write(acl_vault, "projects/poimen/tools/helm.md",
          "---\nacl:\n  allowed_users: [bob, alice, bob]\n---\n# Helm\n")  # fmt: skip
    write(acl_vault, "projects/poimen/tools/open.md", "---\nacl: {}\n---\n# Open\n")
    write(acl_vault, "notes/deny.md", "---\nacl:\n  denied_groups: [interns]\n---\nx\n")
    plan = scan_vault(acl_vault, TEAM)
    docs = acls(plan)
    assert docs["projects/poimen/tools/helm.md"] == DocumentAcl(allowed_users=["alice", "bob"])
    assert docs["projects/poimen/tools/open.md"] is None  # an empty one lifts the folders'
    assert docs["notes/deny.md"] == DocumentAcl(denied_groups=["interns"])  # not + root's staff
    assert docs["projects/poimen/tools/kubectl.md"] == DocumentAcl(denied_groups=["contractors"])
    assert plan.acl_count == 7


def test_project_access_file_with_acl_and_policy_keys(acl_vault):
    plan = scan_vault(acl_vault, TEAM)
    projects = {p.id: p for p in plan.projects}
    # the acl is taken out; the rest is the same policy as without it
    poimen = projects["poimen"]
    assert poimen.access_level == "group" and poimen.owner_group == "platform-team"
    assert poimen.allowed_groups == ["platform-team", "devops-team"]
    assert "acl" not in poimen.model_dump()
    assert set(projects) == {"poimen", "ai-infra"} and len(plan.skills) == 1
    Policy.model_validate(merge_policy(None, plan))


def test_acl_only_project_and_skill_files_declare_no_policy(acl_vault):
    write(acl_vault, "projects/ai-infra/_access.yaml",
          "project: ai-infra\nteam_id: dao_vault\nacl:\n  allowed_groups: [ml-team]\n")  # fmt: skip
    skill = write(acl_vault, "shared/skills/SKILL-kubernetes-debugging/_access.yaml",
                  "acl:\n  allowed_groups: [platform-team]\n")  # fmt: skip
    plan = scan_vault(acl_vault, TEAM)
    assert [p.id for p in plan.projects] == ["poimen"] and plan.skills == []
    assert read_access(skill, "SKILL-kubernetes-debugging", TEAM) is None
    docs = acls(plan)
    assert docs["projects/ai-infra/index.md"] == DocumentAcl(allowed_groups=["ml-team"])
    assert docs["shared/skills/SKILL-kubernetes-debugging/SKILL.md"] == DocumentAcl(
        allowed_groups=["platform-team"]
    )
    # today's behaviour without an acl: an empty project file is still a (private) policy
    empty = write(acl_vault, "projects/ai-infra/_access.yaml", "")
    policy = read_access(empty, "ai-infra", TEAM)
    assert policy is not None and policy.access_level == "private"
    # an acl-only file still has to name its own folder
    write(acl_vault, "projects/ai-infra/_access.yaml", "project: other\nacl: {}\n")
    with pytest.raises(AccessFileError, match="'project' is 'other'"):
        scan_vault(acl_vault, TEAM)


TOO_MANY = "[" + ", ".join(f"g{i}" for i in range(65)) + "]"


@pytest.mark.parametrize(
    "where", ["_access.yaml", "projects/poimen/_access.yaml", "a/b/_access.yaml"]
)
@pytest.mark.parametrize(
    ("acl", "needle"),
    [
        ("acl: [staff]\n", "'acl': expected a mapping"),
        ("acl:\n", "'acl': expected a mapping"),
        ("acl:\n  allowed_group: [staff]\n", "'acl.allowed_group'"),
        ("acl:\n  allowed_groups: staff\n", "'acl.allowed_groups'"),
        ("acl:\n  allowed_users: ['']\n", "'acl.allowed_users.0'"),
        ("acl:\n  denied_groups: [7]\n", "'acl.denied_groups.0'"),
        (
            f"acl:\n  allowed_groups: {TOO_MANY}\n",
            "'acl.allowed_groups': List should have at most 64",
        ),
    ],
)
def test_bad_acl_in_an_access_file_stops_the_import(acl_vault, where, acl, needle):
    path = write(acl_vault, where, acl)
    with pytest.raises(AccessFileError) as exc:
        scan_vault(acl_vault, TEAM)
    assert str(path) in str(exc.value) and needle in str(exc.value)


def test_other_folders_access_file_holds_only_an_acl(acl_vault):
    path = write(acl_vault, "notes/_access.yaml",
                 "acl:\n  allowed_groups: [staff]\naccess_level: public\nowner: x\n")  # fmt: skip
    with pytest.raises(AccessFileError) as exc:
        scan_vault(acl_vault, TEAM)
    message = str(exc.value)
    assert str(path) in message and "'access_level'" in message and "'owner'" in message
    # the vault root and folders below a project are "other" folders too
    write(acl_vault, "notes/_access.yaml", "acl: {}\n")
    root = write(acl_vault, "_access.yaml", "acl: {}\nteam_id: dao_vault\n")
    with pytest.raises(AccessFileError, match="'team_id' not allowed"):
        scan_vault(acl_vault, TEAM)
    root.write_text("acl: {}\n", encoding="utf-8")
    path = write(acl_vault, "projects/poimen/tools/_access.yaml", "access_level: group\n")
    with pytest.raises(AccessFileError, match="'access_level' not allowed"):
        scan_vault(acl_vault, TEAM)
    # an empty one (or only comments) grants nothing: refused, it would fail open where no
    # folder above has an acl (issue 35)
    for text in ("", "# hr only, see wiki\n"):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(AccessFileError, match="grants nothing"):
            scan_vault(acl_vault, TEAM)


@pytest.mark.parametrize(
    ("acl", "needle"),
    [
        ("acl: staff", "acl: expected a mapping"),
        ("acl:\n  groups: [staff]", "acl.groups: Extra inputs"),
        ("acl:\n  denied_groups: {a: 1}", "acl.denied_groups: Input should be a valid list"),
        ('acl:\n  allowed_groups: ["bad\\x01id", "  "]', "acl.allowed_groups.0"),
    ],
)
def test_bad_front_matter_acl_skips_only_that_note(acl_vault, acl, needle):
    write(acl_vault, "projects/poimen/secret.md", f"---\n{acl}\n---\n# Secret\n")
    plan = scan_vault(acl_vault, TEAM)
    skipped = dict(plan.skipped)
    assert needle in skipped["projects/poimen/secret.md"]
    assert "projects/poimen/secret.md" not in by_id(plan) and len(plan.documents) == 5


def test_cli_dry_run_counts_notes_with_an_acl(acl_vault, capsys):
    assert main([str(acl_vault), "--team", TEAM, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "  notes with an ACL: 5\n" in text
    assert "  acl (vault root): allowed_groups=staff\n" in text
    assert "  acl projects/poimen/: allowed_groups=platform-team,sre; allowed_users=carol\n" in text
    assert "  acl projects/poimen/tools/: denied_groups=contractors\n" in text


def test_cli_posts_document_acls(acl_vault, capsys, tmp_path):
    gw = build_gateway(state_url=f"sqlite:///{tmp_path}/state.db")
    token = mint(claims(teams={TEAM: ["owner"]}))
    argv = [str(acl_vault), "--team", TEAM, "--token", token, "--allow-skipped"]
    assert main(argv, client=gw.client) == 0
    assert (
        "indexed 5, unchanged 0, failed 0, removed 0, skipped 1; 6 wiki-links; 5 notes with an ACL"
        in (capsys.readouterr().out)
    )
    graph = gw.services.backends.graph.docs
    assert graph[(TEAM, "README.md")].acl_allow == ("group:staff",)
    kubectl = graph[(TEAM, "projects/poimen/tools/kubectl.md")]
    assert kubectl.acl_allow == ("*",) and kubectl.acl_deny == ("group:contractors",)


# --- CLI -----------------------------------------------------------------------------------


def test_cli_dry_run_prints_the_plan(vault, tmp_path, capsys):
    out = tmp_path / "policy.yaml"
    rc = main([str(vault), "--team", TEAM, "--dry-run", "--policy-out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "5 notes, 1 skipped, 6 wiki-links (4 to notes of the vault)" in text
    assert "project poimen: 2 notes" in text and "project ai-infra: 1 notes" in text
    assert "skill SKILL-kubernetes-debugging: 1 notes" in text
    assert "policy project poimen: group" in text
    assert "policy skill SKILL-kubernetes-debugging: group" in text
    assert "skipped projects/poimen/memories/empty.md" in text
    assert "  notes with an ACL: 0\n" in text
    assert not out.exists()


def test_cli_bad_access_file_exits_2_and_sends_nothing(vault, tmp_path, capsys):
    write(vault, "shared/skills/SKILL-kubernetes-debugging/_access.yaml", "access_level: 7\n")

    class NoClient:
        def post(self, *a, **k):  # pragma: no cover - must not be called
            raise AssertionError("posted despite a bad _access.yaml")

    out = tmp_path / "policy.yaml"
    rc = main([str(vault), "--team", TEAM, "--policy-out", str(out)], client=NoClient())
    err = capsys.readouterr().err
    assert rc == 2
    assert "SKILL-kubernetes-debugging/_access.yaml" in err and "access_level" in err
    assert not out.exists()


def test_cli_posts_to_the_gateway(vault, tmp_path, capsys):
    gw = build_gateway(state_url=f"sqlite:///{tmp_path}/state.db")
    token = mint(claims(teams={TEAM: ["owner"]}))
    out = tmp_path / "policy.yaml"
    argv = [str(vault), "--team", TEAM, "--token", token, "--batch-size", "2", "--allow-skipped"]
    rc = main([*argv, "--policy-out", str(out)], client=gw.client)
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "done: indexed 5, unchanged 0, failed 0, removed 0, skipped 1; 6 wiki-links" in text
    assert "projects: ai-infra, poimen; skills: SKILL-kubernetes-debugging" in text
    assert f"AUTH__POLICY_FILE={out.resolve()}" in text
    Policy.load(out)

    graph = gw.services.backends.graph.docs
    index = graph[(TEAM, "projects/poimen/index.md")]
    assert index.project_id == "poimen" and index.doc_type == "wiki"
    assert index.links == ("kubectl", "skill-kubernetes-debugging")
    assert set(index.tags) == {"k8s", "ops"}
    skill = graph[(TEAM, "shared/skills/SKILL-kubernetes-debugging/SKILL.md")]
    assert "skill:SKILL-kubernetes-debugging" in skill.tags
    assert graph[(TEAM, "projects/poimen/tools/kubectl.md")].links == (
        "root-cause",
        "poimen-overview",
    )

    # idempotent: a second run changes nothing
    assert main(argv, client=gw.client) == 0
    assert "indexed 0, unchanged 5, failed 0" in capsys.readouterr().out


def test_cli_refused_without_a_token(vault):
    gw = build_gateway()
    assert main([str(vault), "--team", TEAM], client=gw.client) == 1
