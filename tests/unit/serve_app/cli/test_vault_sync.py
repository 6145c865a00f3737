"""The vault importer as a sync that fails closed (issue 35), tried as a vault's contributors
(or an attacker with commit access to a shared vault) would: links out of the vault and across
folders, deleted and moved notes, rules taken back, empty and misnamed access files, odd
identifiers, unreadable notes. Readers: a member with group ``hr``, one with no groups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serve_app.cli.vault import main
from serve_app.cli.vault_files import SOURCE_ID_FILE
from serve_app.testing import build_gateway, claims, mint

TEAM = "dao_vault_sync"
WRITER = mint(claims(sub="writer", teams={TEAM: ["owner"]}))
HR = mint(claims(sub="hank", groups=["hr"], teams={TEAM: ["member"]}))
NOBODY = mint(claims(sub="nora", teams={TEAM: ["member"]}))


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    write(root, "public/market.md", "# Market\n\nThe market canary mkt7 opens at nine.\n")
    write(root, "public/solar.md", "# Solar\n\nThe solar canary sol3 feeds the cold store.\n")
    write(root, "hr/_access.yaml", "acl:\n  allowed_groups: [hr, finance]\n")
    write(root, "hr/salary.md", "# Salary\n\nThe salary canary sal9 is confidential.\n")
    return root


@pytest.fixture
def gw(tmp_path: Path):
    return build_gateway(state_url=f"sqlite:///{tmp_path}/state.db")


def sync(gw, vault: Path, *more: str) -> int:
    return main([str(vault), "--team", TEAM, "--token", WRITER, *more], client=gw.client)


def seen(gw, token: str, words: str = "mkt7 sol3 sal9 pwd0 host1 out2") -> set[str]:
    r = gw.client.post(
        "/rag/search_docs",
        json={"team_id": TEAM, "query": words, "search_mode": "bm25", "top_k": 50},
        headers={"authorization": f"Bearer {token}"},
    )
    assert r.status_code == 200, r.text
    return {m["source_ref"]["id"] for m in r.json()["matches"]}


def graph_docs(gw) -> set[str]:
    return {doc_id for team, doc_id in gw.services.backends.graph.docs if team == TEAM}


def test_a_clean_import_gives_each_reader_its_notes(gw, vault):
    assert sync(gw, vault) == 0
    assert seen(gw, HR) == {"public/market.md", "public/solar.md", "hr/salary.md"}
    assert seen(gw, NOBODY) == {"public/market.md", "public/solar.md"}
    assert (vault / SOURCE_ID_FILE).read_text().startswith("vault-")


def test_no_byte_from_outside_the_vault_by_a_link(gw, vault, tmp_path, capsys):
    outside = write(tmp_path, "secrets/passwords.md", "# Passwords\n\nroot canary pwd0\n")
    os.symlink(outside, vault / "public/leak.md")
    os.symlink("/etc/hostname", vault / "public/host.md")
    os.symlink(outside.parent, vault / "public/linked-folder")
    assert sync(gw, vault) == 1  # links skipped: said, and a non-zero exit
    err = capsys.readouterr()
    assert "public/leak.md" in err.out and "outside the vault" in err.out
    assert "public/linked-folder/" in err.out
    assert seen(gw, HR) == {"public/market.md", "public/solar.md", "hr/salary.md"}
    assert "pwd0" not in str(gw.services.backends.graph.docs) and len(graph_docs(gw)) == 3


def test_a_link_across_folders_does_not_carry_a_note_out_of_its_rules(gw, vault):
    os.symlink("../hr/salary.md", vault / "public/salary.md")
    assert sync(gw, vault, "--allow-skipped") == 0
    assert seen(gw, NOBODY, "sal9") == set()
    assert seen(gw, HR, "sal9") == {"hr/salary.md"}  # at its own path, under its own rules


def test_a_linked_access_file_stops_the_import(gw, vault, tmp_path, capsys):
    other = write(tmp_path, "open.yaml", "acl: {}\n")
    (vault / "hr/_access.yaml").unlink()
    os.symlink(other, vault / "hr/_access.yaml")
    assert sync(gw, vault) == 2
    assert "nothing was sent" in capsys.readouterr().err and seen(gw, HR) == set()


def test_deleted_and_moved_notes_are_removed_everywhere(gw, vault):
    assert sync(gw, vault) == 0
    (vault / "public/solar.md").unlink()
    (vault / "public/market.md").rename(vault / "hr/market.md")  # restricting it
    assert sync(gw, vault) == 0
    assert seen(gw, NOBODY) == set()
    assert seen(gw, HR) == {"hr/market.md", "hr/salary.md"}
    assert graph_docs(gw) == {"hr/market.md", "hr/salary.md"}
    rows = {d.doc_id for d in gw.services.pipeline.sources.iter_team(TEAM)}
    assert rows == {"hr/market.md", "hr/salary.md"}
    for token, want in ((NOBODY, set()), (HR, {"hr/market.md"})):
        r = gw.client.post(
            "/rag/enrich_answer",
            json={"team_id": TEAM, "draft_answer": "The market canary mkt7 opens at nine."},
            headers={"authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
        assert {s["id"] for s in r.json()["sources"]} & {
            "public/market.md",
            "hr/market.md",
        } == want


def test_a_group_taken_off_a_folder_loses_its_deleted_notes_too(gw, vault):
    finance = mint(claims(sub="fay", groups=["finance"], teams={TEAM: ["member"]}))
    assert sync(gw, vault) == 0
    assert seen(gw, finance, "sal9") == {"hr/salary.md"}
    (vault / "hr/salary.md").unlink()
    write(vault, "hr/_access.yaml", "acl:\n  allowed_groups: [hr]\n")
    assert sync(gw, vault) == 0
    assert seen(gw, finance, "sal9") == set() and seen(gw, HR, "sal9") == set()


@pytest.mark.parametrize("name", ["_access.yml", "_Access.yaml", "access.yaml", "_ACCESS.YML"])
def test_a_misnamed_access_file_stops_the_import(gw, vault, name, capsys):
    (vault / "hr/_access.yaml").rename(vault / "hr" / name)
    assert sync(gw, vault) == 2
    assert name in capsys.readouterr().err and seen(gw, HR) == set()


@pytest.mark.parametrize("text", ["", "# only hr may read this\n", "\n\n"])
def test_an_access_file_that_grants_nothing_stops_the_import(gw, vault, text, capsys):
    write(vault, "hr/_access.yaml", text)
    assert sync(gw, vault) == 2
    assert "grants nothing" in capsys.readouterr().err and seen(gw, HR) == set()


@pytest.mark.parametrize("entry", ['"h r"', '"x;drop"', '"%"', '"*"', "''"])
def test_an_identifier_outside_the_pattern_stops_the_import(gw, vault, entry, capsys):
    write(vault, "hr/_access.yaml", f"acl:\n  allowed_groups: [hr, {entry}]\n")
    assert sync(gw, vault) == 2
    assert "acl.allowed_groups.1" in capsys.readouterr().err


def test_a_skipped_note_fails_the_run_and_leaves_no_stale_copy(gw, vault, capsys):
    assert sync(gw, vault) == 0
    (vault / "hr/salary.md").write_bytes(b"# Salary\n\n\xff\xfe not UTF-8 sal9\n")
    write(vault, "hr/typo.md", "---\nacl: {allowed_grups: [hr]}\n---\n# Typo\n\ncanary out2\n")
    assert sync(gw, vault) == 1
    out = capsys.readouterr().out
    assert "skipped hr/salary.md" in out and "skipped hr/typo.md" in out
    # The old, imported copy of a note now skipped is removed (it is not what the vault holds).
    assert seen(gw, HR) == {"public/market.md", "public/solar.md"}
    assert sync(gw, vault, "--allow-skipped") == 0


def test_a_dry_run_names_what_would_be_removed_and_changes_nothing(gw, vault, capsys):
    assert sync(gw, vault) == 0
    (vault / "public/solar.md").unlink()
    capsys.readouterr()
    assert sync(gw, vault, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would remove 1 of the 3 documents" in out and "- public/solar.md" in out
    write(vault, "public/wind.md", "# Wind\n\nA new note.\n")
    assert sync(gw, vault, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would add 1 notes the gateway does not have, send 2 it has" in out
    assert "+ public/wind.md" in out and "public/wind.md" not in seen(gw, NOBODY, "wind")
    assert "public/solar.md" in seen(gw, NOBODY)


def test_no_prune_keeps_the_old_append_behaviour(gw, vault):
    assert sync(gw, vault) == 0
    (vault / "public/solar.md").unlink()
    assert sync(gw, vault, "--no-prune") == 0
    assert "public/solar.md" in seen(gw, NOBODY)


def test_a_fifo_in_the_vault_neither_hangs_nor_is_read(gw, vault, capsys):
    os.mkfifo(vault / "public/pipe.md")
    assert sync(gw, vault) == 1
    assert "public/pipe.md: not a regular file" in capsys.readouterr().out


def test_another_vaults_documents_are_not_pruned(gw, vault, tmp_path):
    other = tmp_path / "other"
    write(other, "notes/host.md", "# Other vault\n\nIts canary host1.\n")
    assert sync(gw, vault) == 0 and sync(gw, other) == 0
    (vault / "public/solar.md").unlink()
    assert sync(gw, vault) == 0
    assert "notes/host.md" in seen(gw, NOBODY)
