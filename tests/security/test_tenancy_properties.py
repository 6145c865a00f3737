"""Property tests: whatever the identity, the token and the request hold, no response of any
endpoint carries another team's data, or confidential data (or data of a project, skill or
doc type) the caller is not allowed to see; and no request ever gives a 500.

The expected visibility is computed by an oracle written from the policy's rules directly,
not by the gateway's own AccessContext, and checked on every match and on the raw response
text (each corpus document carries a unique marker in its title and text).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from serve_app.testing import (
    TEAMS,
    TENANCY_POLICY,
    build_gateway,
    claims,
    mint,
    tenancy_corpus,
    unsigned_token,
)
from tests.gateway_env import gateway_env_removed

pytestmark = pytest.mark.usefixtures("clean_gateway_env")

CORPUS = tenancy_corpus()
MARKER = re.compile(r"qmk(\d+)q")
ROLES = ("member", "guest", "owner", "service", "guardian", "visitor")
CONFIDENTIAL_ROLES = {"owner", "guardian"}
WRITE_ROLES = {"owner", "guardian", "service"}
ALL = None
DOC_TYPES_OF_ROLE: dict[str, set[str] | None] = {
    "owner": ALL,
    "guardian": ALL,
    "service": {"message", "doc", "wiki"},
    "member": {"message", "doc", "file", "wiki", "rwa"},
    "guest": {"doc", "wiki"},
}
# Bounded so the unit suite stays fast (about 10 ms per request in-process).
PROPERTY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FEWER = settings(PROPERTY_SETTINGS, max_examples=100)

ADVERSARIAL = [
    '"',
    "'",
    "\\",
    '\\"',
    'dao_a" or team_id != "',
    "dao_a' OR '1'='1",
    "or 1==1",
    '" or 1==1 or "',
    'team_id in ["dao_a", "dao_b"]',
    "dao_a\\",
    "%",
    "*",
    "dao_*",
    " dao_b ",
    "DAO_A",
    "dao_a\u200b",
    "ｄａｏ＿ａ",
    "дао_а",
    "\u202edao_a",
    "😀" * 10,
    "a" * 300,
    "x" * 5000,
    "\x00",
    "line\nbreak",
    "confidential",
    "public",
    "prj_ops",
    "prj_board",
    "SKILL-deploy",
    "skill:SKILL-deploy",
]
adversarial = st.sampled_from(ADVERSARIAL) | st.text(max_size=40)
team_name = st.sampled_from(TEAMS) | adversarial


# --- the oracle ------------------------------------------------------------------------------


def doc_types_of(roles: set[str]) -> set[str] | None:
    allowed: set[str] = set()
    for role in roles:
        types = DOC_TYPES_OF_ROLE.get(role, set())
        if types is ALL:
            return ALL
        allowed |= types
    return allowed


def resource_allowed(doc: dict[str, Any], groups: set[str], permissions: set[str]) -> bool:
    project, doc_id = doc.get("project_id", ""), doc["doc_id"]
    if project == "prj_ops" and "ops" not in groups:
        return False
    if project == "prj_board" and "board" not in groups:
        return False
    tags = doc.get("tags", [])
    skill = doc_id == "SKILL-deploy" or "skill:SKILL-deploy" in tags
    return not (skill and "skill:read" not in permissions)


def acl_allowed(doc: dict[str, Any], sub: str, groups: set[str]) -> bool:
    """The document ACL as the spec states it: a denied group never reads; with allow lists,
    only their groups and users read; without, everyone else does. ``doc["acl"]`` is the
    document's list, or ``acl_allow``/``acl_deny`` tokens of a graph node."""
    acl = doc.get("acl")
    if acl is None and ("acl_allow" in doc or "acl_deny" in doc):
        allow = [t for t in doc.get("acl_allow") or ["*"] if t != "*"]
        acl = {
            "allowed_groups": [t[6:] for t in allow if t.startswith("group:")],
            "allowed_users": [t[5:] for t in allow if t.startswith("user:")],
            "denied_groups": [t[6:] for t in doc.get("acl_deny") or [] if t.startswith("group:")],
        }
    if not acl:
        return True
    if groups & set(acl.get("denied_groups", ())):
        return False
    allowed_groups = set(acl.get("allowed_groups", ()))
    allowed_users = set(acl.get("allowed_users", ()))
    if not allowed_groups and not allowed_users:
        return True
    return bool(groups & allowed_groups) or sub in allowed_users


def may_read(identity: dict[str, Any], team: str, confidential_mode: bool, doc: dict) -> bool:
    roles = set(identity["teams"].get(team, ()))
    if not roles or doc["team_id"] != team:
        return False
    if doc.get("visibility", "public") == "confidential" and not (
        confidential_mode and roles & CONFIDENTIAL_ROLES
    ):
        return False
    types = doc_types_of(roles)
    if types is not ALL and doc.get("doc_type", "doc") not in types:
        return False
    if not acl_allowed(doc, identity.get("sub", ""), set(identity["groups"])):
        return False
    return resource_allowed(doc, identity["groups"], identity["permissions"])


def may_write(identity: dict[str, Any], doc: dict) -> bool:
    roles = set(identity["teams"].get(doc["team_id"], ()))
    if not roles & WRITE_ROLES:
        return False
    if doc.get("visibility", "public") == "confidential" and not roles & CONFIDENTIAL_ROLES:
        return False
    types = doc_types_of(roles)
    if types is not ALL and doc.get("doc_type", "doc") not in types:
        return False
    return resource_allowed(doc, identity["groups"], identity["permissions"])


# --- strategies ------------------------------------------------------------------------------


def mostly(normal: st.SearchStrategy, rare: st.SearchStrategy = adversarial) -> Any:
    """``normal`` five times in six, else ``rare``."""
    return st.one_of(normal, normal, normal, normal, normal, rare)


def identities(roles: tuple[str, ...] = ROLES) -> st.SearchStrategy:
    """Token identities; ``roles`` in the order hypothesis should favour (it prefers the
    first), so searches see many non-confidential roles and ingestion many writers."""
    return st.fixed_dictionaries(
        {
            "sub": mostly(st.sampled_from(["alice", "bob"]), adversarial.filter(bool)),
            "teams": st.dictionaries(
                mostly(st.sampled_from(TEAMS)).filter(
                    lambda t: 0 < len(t) <= 256 and "\x00" not in t
                ),
                st.lists(st.sampled_from(roles), min_size=1, max_size=3, unique=True),
                min_size=1,
                max_size=3,
            ),
            "groups": st.sets(st.sampled_from(["ops", "board", "dev"])),
            "permissions": st.sets(st.sampled_from(["skill:read", "memory:read"])),
            "agent_id": st.sampled_from(["", "ag_1", "ag_2"]),
        }
    )


# Everything but "valid" must be refused with 401.
BAD_TOKENS = [
    "expired",
    "not_yet",
    "wrong_aud",
    "wrong_iss",
    "forged",
    "alg_none",
    "garbage",
    "cut",
]
token_kinds = st.sampled_from(["valid"] * 5 * len(BAD_TOKENS) + BAD_TOKENS)


def token_for(identity: dict[str, Any], kind: str) -> str:
    now = int(time.time())
    payload = claims(
        sub=identity["sub"],
        teams=identity["teams"],
        groups=sorted(identity["groups"]),
        permissions=sorted(identity["permissions"]),
        agent_id=identity["agent_id"] or None,
    )
    if kind == "expired":
        payload["exp"] = now - 3600
    elif kind == "not_yet":
        payload["nbf"] = now + 3600
    elif kind == "wrong_aud":
        payload["aud"] = "another-service"
    elif kind == "wrong_iss":
        payload["iss"] = "https://evil.example/"
    if kind == "forged":
        return mint(payload, key="an-attacker-secret-that-is-long-enough-0")
    if kind == "alg_none":
        return unsigned_token(payload, {"alg": "none", "typ": "JWT"})
    if kind == "garbage":
        return "not.a.token"
    token = mint(payload)
    return token[: len(token) // 2] if kind == "cut" else token


def team_for(identity: dict[str, Any], noisy: bool) -> st.SearchStrategy:
    """A team the identity grants; in noisy cases sometimes any team name or adversarial."""
    granted = sorted(identity["teams"])
    if not granted:
        return team_name
    return mostly(st.sampled_from(granted), team_name) if noisy else st.sampled_from(granted)


def field(normal: st.SearchStrategy, noisy: bool) -> st.SearchStrategy:
    """Every field of a noisy case may hold an adversarial string; a clean case (half of
    them) is well-formed, so enough requests reach a 200 to check what comes back."""
    return mostly(normal) if noisy else normal


def search_filters(noisy: bool) -> st.SearchStrategy:
    return st.fixed_dictionaries(
        {},
        optional={
            "project_id": field(st.sampled_from(["", "prj_open", "prj_ops", "prj_board"]), noisy),
            "channel_id": field(st.sampled_from(["ch_1", ""]), noisy),
            "agent_id": field(st.sampled_from(["ag_1", ""]), noisy),
            "doc_type": st.lists(
                field(st.sampled_from(["doc", "wiki", "message", "transaction", "file"]), noisy),
                max_size=4,
            ),
            "tags": st.lists(field(st.sampled_from(["milvus", "rag"]), noisy), max_size=3),
            "visibility": field(st.sampled_from(["public", "confidential"]), noisy),
        },
    )


@st.composite
def search_cases(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    identity = draw(identities())
    noisy = draw(st.booleans())
    body = draw(
        st.fixed_dictionaries(
            {
                "team_id": team_for(identity, noisy),
                "query": field(
                    st.sampled_from(["Milvus gateway search notes", "deploy budget qmk3q"]), noisy
                ),
                "top_k": st.sampled_from([5, 50, 50]),
            },
            optional={
                "user_id": field(st.just(identity["sub"]), noisy),
                "agent_id": field(st.just(identity["agent_id"]), noisy),
                "filters": search_filters(noisy),
                "search_mode": st.sampled_from(["hybrid", "dense", "bm25"]),
            },
        )
    )
    # The privacy flag under either name, or absent (public); confidential half the time.
    mode = draw(field(st.sampled_from(["confidential", "public", None]), noisy))
    if mode is not None:
        body[draw(st.sampled_from(["mode", "visibility"]))] = mode
    return identity, body


@st.composite
def ingest_cases(draw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    identity = draw(identities(("service", "owner", "member", "guardian", "guest", "visitor")))
    noisy = draw(st.booleans())
    document = st.fixed_dictionaries(
        {
            "team_id": team_for(identity, noisy),
            "doc_id": field(st.sampled_from(["d1", "dao_a_pub_doc", "SKILL-deploy"]), noisy),
            "text": field(st.just("Milvus notes"), noisy),
        },
        optional={
            # Hypothesis favours the first value: the one a caller is least likely to be
            # allowed to write.
            "visibility": field(st.sampled_from(["confidential", "public"]), noisy),
            "doc_type": field(st.sampled_from(["transaction", "doc", "wiki", "message"]), noisy),
            "project_id": field(st.sampled_from(["prj_ops", "", "prj_board"]), noisy),
            "tags": st.lists(
                field(st.sampled_from(["skill:SKILL-deploy", "rag"]), noisy), max_size=2
            ),
            "title": field(st.just("A title"), noisy),
            "channel_id": field(st.just("ch_1"), noisy),
        },
    )
    return identity, draw(st.lists(document, min_size=1, max_size=3))


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def search_gateway():
    with gateway_env_removed():
        return build_gateway(policy=TENANCY_POLICY, corpus=CORPUS)


def assert_clean_failure(response) -> None:
    assert response.status_code != 500, response.text
    assert response.status_code in (401, 403, 422), response.text
    assert set(response.json()) >= {"error", "message", "trace_id"}


# --- search ----------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(case=search_cases(), kind=token_kinds)
def test_search_never_returns_data_the_caller_may_not_see(search_gateway, case, kind):
    identity, body = case
    response = search_gateway.search(body, token_for(identity, kind))
    event(f"status {response.status_code}")
    if response.status_code == 403:
        event("403 " + str(response.json().get("reason")))
    if kind != "valid":
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"].startswith("Bearer")
    if response.status_code != 200:
        assert_clean_failure(response)
        leaked = {int(i) for i in MARKER.findall(response.text)}
        assert not leaked, f"markers {leaked} in a {response.status_code} body"
        return

    raw_team = str(body["team_id"])
    granted = {raw_team, raw_team.strip()} & set(identity["teams"])
    assert granted, "200 for a team the identity does not grant"
    matches = response.json()["matches"]
    event("matches" if matches else "no matches")
    returned_teams = {m["source_ref"]["team_id"] for m in matches}
    assert len(returned_teams) <= 1 and returned_teams <= granted, returned_teams
    team = next(iter(returned_teams), raw_team.strip())
    confidential_mode = body.get("mode", body.get("visibility")) == "confidential"
    visible = {
        i for i, doc in enumerate(CORPUS) if may_read(identity, team, confidential_mode, doc)
    }
    leaked = {int(i) for i in MARKER.findall(response.text)} - visible
    assert not leaked, [CORPUS[i]["doc_id"] for i in leaked]
    returned = {m["source_ref"]["id"] for m in matches}
    allowed_ids = {CORPUS[i]["doc_id"] for i in visible}
    assert returned <= allowed_ids


# --- enrich ----------------------------------------------------------------------------------

DRAFT_SENTENCES = [
    "The Milvus gateway search notes describe the deploy budget.",
    "qmk3q is the deploy budget of the gateway.",
    "Confidential payroll notes mention qmk12q and Milvus.",
]


@st.composite
def enrich_cases(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A search case turned into an enrich request: the same identities, teams, modes and
    filters, and a draft whose claims name the corpus (markers included) or adversarial
    text."""
    identity, body = draw(search_cases())
    noisy = draw(st.booleans())
    sentences = draw(
        st.lists(field(st.sampled_from(DRAFT_SENTENCES), noisy), min_size=1, max_size=3)
    )
    enrich = {k: v for k, v in body.items() if k not in ("query", "top_k", "search_mode")}
    enrich["question"] = body["query"]
    enrich["draft_answer"] = " ".join(str(x) for x in sentences)
    enrich["max_docs"] = draw(st.sampled_from([1, 3, 10]))
    return identity, enrich


@PROPERTY_SETTINGS
@given(case=enrich_cases(), kind=token_kinds)
def test_enrich_never_cites_data_the_caller_may_not_see(search_gateway, case, kind):
    identity, body = case
    token = token_for(identity, kind)
    response = search_gateway.client.post(
        "/rag/enrich_answer", json=body, headers={"authorization": f"Bearer {token}"}
    )
    event(f"status {response.status_code}")
    if kind != "valid":
        assert response.status_code == 401, response.text
    asked = {int(i) for i in MARKER.findall(json.dumps(body, default=str))}
    found = {int(i) for i in MARKER.findall(response.text)} - asked
    if response.status_code != 200:
        assert_clean_failure(response)
        assert not found, f"markers {found} in a {response.status_code} body"
        return
    raw_team = str(body["team_id"])
    granted = {raw_team, raw_team.strip()} & set(identity["teams"])
    assert granted, "200 for a team the identity does not grant"
    team = next(iter(granted)).strip()
    confidential_mode = body.get("mode", body.get("visibility")) == "confidential"
    visible = {
        i for i, doc in enumerate(CORPUS) if may_read(identity, team, confidential_mode, doc)
    }
    assert not found - visible, [CORPUS[i]["doc_id"] for i in found - visible]
    sources = response.json()["sources"]
    event("cited" if sources else "nothing cited")
    allowed_ids = {CORPUS[i]["doc_id"] for i in visible}
    assert {s["id"] for s in sources} <= allowed_ids
    assert {s["team_id"] for s in sources} <= {team}


@pytest.fixture(scope="module")
def dev_gateway():
    with gateway_env_removed():
        return build_gateway(auth={"mode": "dev"}, policy=TENANCY_POLICY, corpus=CORPUS)


@FEWER
@given(case=search_cases())
def test_search_in_dev_mode_never_crosses_the_body_team(dev_gateway, case):
    """Development body trust: still no other team's chunk, and public only unless asked."""
    _, body = case
    response = dev_gateway.search(body)
    event(f"status {response.status_code}")
    if response.status_code != 200:
        assert_clean_failure(response)
        return
    team = str(body["team_id"]).strip()
    confidential_mode = body.get("mode", body.get("visibility")) == "confidential"
    for match in response.json()["matches"]:
        assert match["source_ref"]["team_id"] == team
    # The dev principal is an owner without groups or permissions, whose subject is the
    # body's user_id: project, skill and document ACL policies still apply to it.
    sub = str(body.get("user_id") or "").strip() or "dev"
    owner = {"sub": sub, "teams": {team: ["owner"]}, "groups": set(), "permissions": set()}
    visible = {i for i, d in enumerate(CORPUS) if may_read(owner, team, confidential_mode, d)}
    assert not {int(i) for i in MARKER.findall(response.text)} - visible


# --- ingestion -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ingest_gateway():
    with gateway_env_removed():
        return build_gateway(policy=TENANCY_POLICY, corpus=CORPUS)


@PROPERTY_SETTINGS
@given(case=ingest_cases(), kind=token_kinds)
def test_ingest_writes_only_where_the_caller_may_write(ingest_gateway, case, kind):
    identity, docs = case
    before = dict(ingest_gateway.store.rows)
    response = ingest_gateway.ingest(docs, token_for(identity, kind))
    event(f"status {response.status_code}")
    assert not MARKER.findall(response.text)
    if kind != "valid":
        assert response.status_code == 401, response.text
    if response.status_code != 200:
        assert_clean_failure(response)
        assert ingest_gateway.store.rows == before
        return
    for doc in docs:
        normalized = {**doc, "team_id": doc["team_id"].strip()}
        assert may_write(identity, normalized), f"wrote {doc!r} for {identity!r}"
    changed = {
        cid: row for cid, row in ingest_gateway.store.rows.items() if before.get(cid) is not row
    }
    writable = {doc["team_id"].strip() for doc in docs}
    assert {row.team_id for row in changed.values()} <= writable
    assert {row.team_id for row in changed.values()} <= set(identity["teams"])
