"""Property-based tenancy tests (hypothesis) of the graph endpoints against the real Neo4j:
for random identities (teams, roles, groups, permissions, bad tokens), modes, intents with
real or adversarial arguments, caller Cypher (scoped, attacking, writing) and explain_path
references, no response holds an entity of another team or one the caller may not see, a
write never changes the graph, and a bad credential is always 401.

The graph is seeded once per module by the leak-probe machinery (tests/security/leak_probes.py:
three teams of this run, documents with markers, wiki-links, users, projects, resources and
agents in both visibilities); its oracle (``GraphSeed.visible`` of tests/security/graph_seed.py)
is written from the policy's rules, not from AccessContext.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.graph_store.cypher import NODE_LABELS
from deployments.graph_store.intents import INTENTS
from tests.security.graph_attacks import INJECTIONS, REFUSED_CYPHER, SCOPED_CYPHER, WRITE_CYPHER
from tests.security.leak_probes import Prober, isolated_env
from tests.security.test_tenancy_properties import ADVERSARIAL, BAD_TOKENS, ROLES, token_for

pytestmark = pytest.mark.integration

PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def prober(settings):  # noqa: F811 (the integration conftest's settings fixture)
    with (
        tempfile.TemporaryDirectory(prefix="graph_props_") as tmp,
        isolated_env(f"sqlite:///{Path(tmp) / 'audit.db'}"),
    ):
        p = Prober(7, Path(tmp), settings.neo4j)
        try:
            yield p
        finally:
            try:
                checks = p.close_graph()
            finally:
                p.close()
    # Writes were refused: the graph is the seed plus nothing (this module upserts nothing).
    assert checks.get("changed_outside_upserts") == 0, checks
    assert checks.get("sentinels") == 0 and checks.get("left_after_clean_up") == 0, checks


def identities(teams: tuple[str, ...]) -> st.SearchStrategy:
    return st.fixed_dictionaries(
        {
            "sub": st.sampled_from(["alice", "bob"]),
            "teams": st.dictionaries(
                st.sampled_from(teams),
                st.lists(st.sampled_from(ROLES), min_size=1, max_size=2, unique=True),
                min_size=1,
                max_size=2,
            ),
            "groups": st.sets(st.sampled_from(["ops", "board", "dev"])),
            "permissions": st.sets(st.sampled_from(["skill:read", "memory:read"])),
            "agent_id": st.just(""),
        }
    )


def refs(prober: Prober) -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from(prober.graph_refs),
        st.sampled_from(prober.graph_refs),
        st.sampled_from(INJECTIONS),
        st.sampled_from(ADVERSARIAL),
    )


@st.composite
def graph_requests(draw: Any, prober: Prober) -> tuple[dict, str, dict[str, Any]]:
    identity = draw(identities(prober.teams))
    kind = draw(st.sampled_from(["valid"] * 4 + BAD_TOKENS))
    granted = sorted(identity["teams"])
    team = draw(st.one_of(st.sampled_from(granted), st.sampled_from(prober.teams)))
    body: dict[str, Any] = {"team_id": team}
    mode = draw(st.sampled_from(["public", "confidential", None]))
    if mode:
        body["mode"] = mode
    what = draw(st.sampled_from(["intent", "cypher", "path"]))
    if what == "intent":
        name = draw(st.sampled_from(sorted(INTENTS)))
        body["intent"] = name
        args: dict[str, Any] = {}
        for field in INTENTS[name].args.model_fields:
            if field == "limit":
                continue
            if draw(st.booleans()) or field not in ("role", "target"):
                args[field] = draw(refs(prober))
        body["args"] = args
        path = "/graph/query"
    elif what == "cypher":
        foreign = draw(st.sampled_from([t for t in prober.teams if t != team] or [team]))
        category = draw(st.sampled_from(["scoped", "refused", "write"]))
        if category == "scoped":
            query = draw(st.sampled_from(SCOPED_CYPHER)).format(
                label=draw(st.sampled_from(NODE_LABELS))
            )
        elif category == "refused":
            query = draw(st.sampled_from(REFUSED_CYPHER)).replace("{foreign}", foreign)
        else:
            query = draw(st.sampled_from(WRITE_CYPHER)).format(
                foreign=foreign, sentinel=f"pwn_{prober.tag}", tag=prober.tag
            )
        body["cypher"] = query
        params = {}
        if "$ref" in body["cypher"]:
            params["ref"] = draw(refs(prober))
        if "$lucene" in body["cypher"]:
            params["lucene"] = draw(st.sampled_from(["milvus", "qmk1q", '"((', "*:*"]))
        body["params"] = params
        path = "/graph/query"
    else:
        body["from"] = draw(refs(prober))
        body["to"] = draw(refs(prober))
        path = "/graph/explain_path"
    return identity, kind, {"path": path, "body": body}


def test_no_graph_response_leaks(prober: Prober):
    @PROPERTY_SETTINGS
    @given(case=graph_requests(prober))
    def check(case):
        identity, kind, request = case
        headers = {"authorization": f"Bearer {token_for(identity, kind)}"}
        expected = identity if kind == "valid" else None
        before = prober.snapshots.snapshot() if "cypher" in request["body"] else None
        response = prober.graph_gw.post(request["path"], request["body"], headers)
        assert response.status_code < 500, response.text
        problem = prober.check_graph(expected, request["body"], response)
        assert problem is None, (problem, request, response.text[:2000])
        if before is not None:
            assert prober.snapshots.snapshot() == before, request

    check()
