"""Property (issue 35): for random vault trees, random folder rules and random edit sequences
(add, delete, move notes; add, change, remove rules), each followed by a re-import, every
reader sees exactly the notes the vault's current rules give it, nothing more and nothing
less: by search and by enrich; and the graph and the source registry hold exactly the
vault's current notes."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.cli.vault import main
from serve_app.testing import build_gateway, claims, mint

FOLDERS = ("", "a", "a/b", "c")
GROUPS = ("g1", "g2")
READER_GROUPS = (frozenset(), frozenset({"g1"}), frozenset({"g2"}), frozenset(GROUPS))
_teams = itertools.count()


class Team:
    """A fresh team per example on the shared gateway, with its writer and four readers."""

    def __init__(self) -> None:
        self.id = f"dao_vault_prop_{next(_teams)}"
        self.writer = mint(claims(sub="writer", teams={self.id: ["owner"]}))
        self.readers = {
            groups: mint(
                claims(
                    sub="u" + "".join(sorted(groups)),
                    groups=sorted(groups),
                    teams={self.id: ["member"]},
                )
            )
            for groups in READER_GROUPS
        }


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    """One in-process gateway for every example (building one per example cost most of the
    test's time); examples never share a team, so none sees another's notes."""
    state = tmp_path_factory.mktemp("vault_prop") / "state.db"
    return build_gateway(state_url=f"sqlite:///{state}")


# A folder's rule: none (no file), open (acl: {}), allowed groups, or a denied group.
rules = st.one_of(
    st.none(),
    st.just(("open",)),
    st.tuples(st.just("allow"), st.sets(st.sampled_from(GROUPS), min_size=1)),
    st.tuples(st.just("deny"), st.sampled_from(GROUPS)),
)
notes = st.dictionaries(st.integers(0, 7), st.sampled_from(FOLDERS), max_size=6)
edits = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 7), st.sampled_from(FOLDERS)),
        st.tuples(st.just("delete"), st.integers(0, 7)),
        st.tuples(st.just("move"), st.integers(0, 7), st.sampled_from(FOLDERS)),
        st.tuples(st.just("rule"), st.sampled_from(FOLDERS), rules),
    ),
    max_size=5,
)


def rel(folder: str, n: int) -> str:
    return f"{folder}/n{n}.md" if folder else f"n{n}.md"


def render(root: Path, tree: dict[int, str], folder_rules: dict[str, tuple | None]) -> None:
    """Write the vault as ``tree`` (note -> folder) and ``folder_rules`` say, from scratch."""
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file() and path.name != ".rag-vault-id":
            path.unlink()
    for n, folder in tree.items():
        path = root / rel(folder, n)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {n}\n\nThe canary word mark{n} lives here.\n", encoding="utf-8")
    for folder, rule in folder_rules.items():
        if rule is None:
            continue
        text = {
            "open": "acl: {}\n",
            "allow": f"acl:\n  allowed_groups: [{', '.join(sorted(rule[-1]))}]\n",
            "deny": f"acl:\n  denied_groups: [{rule[-1]}]\n",
        }[rule[0]]
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "_access.yaml").write_text(text, encoding="utf-8")


def may_read(groups: frozenset[str], folder: str, folder_rules: dict[str, tuple | None]) -> bool:
    """The nearest folder with a rule decides; none above: open."""
    parts = folder.split("/") if folder else []
    for depth in range(len(parts), -1, -1):
        rule = folder_rules.get("/".join(parts[:depth]))
        if rule is None:
            continue
        if rule[0] == "open":
            return True
        if rule[0] == "allow":
            return bool(groups & rule[1])
        return rule[1] not in groups
    return True


def apply(tree: dict[int, str], folder_rules: dict, edit: tuple) -> None:
    kind = edit[0]
    if kind == "add":
        tree.setdefault(edit[1], edit[2])
    elif kind == "delete":
        tree.pop(edit[1], None)
    elif kind == "move" and edit[1] in tree:
        tree[edit[1]] = edit[2]
    elif kind == "rule":
        folder_rules[edit[1]] = edit[2]


def check(gw, team: Team, tree: dict[int, str], folder_rules: dict) -> None:
    query = " ".join(f"mark{n}" for n in range(8))
    for groups, token in team.readers.items():
        want = {rel(f, n) for n, f in tree.items() if may_read(groups, f, folder_rules)}
        r = gw.client.post(
            "/rag/search_docs",
            json={"team_id": team.id, "query": query, "search_mode": "bm25", "top_k": 50},
            headers={"authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
        got = {m["source_ref"]["id"] for m in r.json()["matches"]}
        assert got == want, (sorted(groups), tree, folder_rules)
    # Enrich cites nothing the reader without groups may not read.
    open_notes = {rel(f, n) for n, f in tree.items() if may_read(frozenset(), f, folder_rules)}
    r = gw.client.post(
        "/rag/enrich_answer",
        json={"team_id": team.id, "draft_answer": f"The canary word {query} lives here."},
        headers={"authorization": f"Bearer {team.readers[frozenset()]}"},
    )
    assert r.status_code == 200, r.text
    assert {s["id"] for s in r.json()["sources"]} <= open_notes
    current = {rel(f, n) for n, f in tree.items()}
    assert {d for t, d in gw.services.backends.graph.docs if t == team.id} == current
    assert {d.doc_id for d in gw.services.pipeline.sources.iter_team(team.id)} == current


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    tree=notes,
    folder_rules=st.dictionaries(st.sampled_from(FOLDERS), rules),
    rounds=st.lists(edits, min_size=1, max_size=2),
)
def test_every_reader_sees_exactly_what_the_current_rules_give(gw, tree, folder_rules, rounds):
    team = Team()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "vault"
        root.mkdir()
        argv = [str(root), "--team", team.id, "--token", team.writer]
        for edit_round in [[], *rounds]:
            for edit in edit_round:
                apply(tree, folder_rules, edit)
            render(root, tree, folder_rules)
            assert main(argv, client=gw.client) == 0
            check(gw, team, tree, folder_rules)
