"""Authentication and policy over HTTP: 401 and 403 bodies, tenancy from the token, the
project pre-check, result filtering, and ingestion rights (in-process app, fakes, no Ray)."""

from __future__ import annotations

import pytest

from serve_app.testing import (
    EC_KEY,
    PEPPER,
    RSA_KEY,
    TENANCY_POLICY,
    JwksServer,
    build_gateway,
    claims,
    jwks,
    jwt_auth,
    mint,
    tenancy_corpus,
    unsigned_token,
    write_api_keys,
)

pytestmark = pytest.mark.usefixtures("clean_gateway_env")

QUERY = {"team_id": "dao_a", "query": "Milvus gateway search notes", "top_k": 50}


def token(teams=None, **overrides) -> str:
    return mint(claims(teams=teams or {"dao_a": ["member"]}, **overrides))


def ids(response) -> set[str]:
    assert response.status_code == 200, response.text
    return {m["source_ref"]["id"] for m in response.json()["matches"]}


@pytest.fixture
def gateway():
    return build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())


# --- 401 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/rag/search_docs", "/ingest/documents"])
def test_missing_credentials_is_401_with_error_body_and_challenge(gateway, path):
    response = gateway.client.post(path, json={})
    assert response.status_code == 401
    body = response.json()
    assert body["error"] == "unauthorized"
    assert body["message"] == "credentials required"
    assert "Bearer" in body["hint"]
    assert body["trace_id"]
    assert response.headers["www-authenticate"] == 'Bearer realm="rag-gateway"'


@pytest.mark.parametrize(
    "credential",
    [
        "garbage",
        "a.b.c",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0",
        unsigned_token(claims(), {"alg": "none"}),
        mint(claims(exp=1)),
        mint(claims(aud="other")),
        mint(claims(iss="https://evil.example/")),
        mint(key="a-different-secret-that-is-long-enough-000"),
        mint(claims(teams=[{"id": 5}])),
        mint(claims(sub=["alice"])),
        mint(claims(teams={"dao_a": {"role": "owner"}})),
        "x" * 20_000,
    ],
    ids=lambda c: c[:24],
)
def test_bad_tokens_are_401_invalid_token_never_500(gateway, credential):
    response = gateway.search(QUERY, credential)
    assert response.status_code == 401, response.text
    assert response.json()["error"] == "unauthorized"
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


def test_credentials_are_checked_before_the_body(gateway):
    response = gateway.client.post("/rag/search_docs", content="not json")
    assert response.status_code == 401


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_endpoints_need_no_credentials(gateway, path):
    assert gateway.client.get(path).status_code == 200


# --- tenancy ---------------------------------------------------------------------------------


def test_search_stays_in_the_team_of_the_request(gateway):
    found = ids(gateway.search(QUERY, token()))
    assert found and all(i.startswith("dao_a_") or i == "SKILL-deploy" for i in found)
    assert {
        m["source_ref"]["team_id"] for m in gateway.search(QUERY, token()).json()["matches"]
    } == {"dao_a"}


def test_team_not_granted_is_403_naming_it_and_nothing_is_searched(gateway):
    response = gateway.search(QUERY | {"team_id": "dao_b"}, token())
    assert response.status_code == 403
    body = response.json()
    assert body["error"] == "forbidden"
    assert body["reason"] == "team_not_granted"
    assert "'dao_b'" in body["message"]
    assert body["fields"][0]["field"] == "team_id"
    assert gateway.store.searches == []


@pytest.mark.parametrize("alias", ["dao_id", "microdao_id"])
def test_team_aliases_are_checked_the_same_way(gateway, alias):
    body = {k: v for k, v in QUERY.items() if k != "team_id"}
    assert gateway.search(body | {alias: "dao_b"}, token()).status_code == 403
    assert gateway.search(body | {alias: "dao_a"}, token()).status_code == 200


def test_member_in_confidential_mode_is_403_with_reason(gateway):
    response = gateway.search(QUERY | {"mode": "confidential"}, token())
    assert response.status_code == 403
    assert response.json()["reason"] == "confidential_not_granted"


def test_owner_sees_confidential_only_in_confidential_mode(gateway):
    owner = token({"dao_a": ["owner"]}, groups=["ops", "board"], permissions=["skill:read"])
    public = ids(gateway.search(QUERY, owner))
    assert "dao_a_conf_doc" not in public
    everything = ids(gateway.search(QUERY | {"mode": "confidential"}, owner))
    assert {"dao_a_conf_doc", "dao_a_conf_wiki", "dao_a_board_conf"} <= everything


def test_roles_are_per_team(gateway):
    both = token({"dao_a": ["owner"], "dao_b": ["guest"]})
    assert gateway.search(QUERY | {"mode": "confidential"}, both).status_code == 200
    other = QUERY | {"team_id": "dao_b", "mode": "confidential"}
    assert gateway.search(other, both).status_code == 403


def test_body_user_id_of_someone_else_is_403(gateway):
    response = gateway.search(QUERY | {"user_id": "bob"}, token())
    assert response.json()["reason"] == "user_id_mismatch"
    assert gateway.search(QUERY | {"user_id": "alice"}, token()).status_code == 200


def test_agent_token_cannot_claim_another_agent(gateway):
    agent = token(agent_id="ag_1")
    assert gateway.search(QUERY | {"agent_id": "ag_2"}, agent).status_code == 403
    assert gateway.search(QUERY | {"agent_id": "ag_1"}, agent).status_code == 200


# --- doc types and resource policies ---------------------------------------------------------


def test_guest_sees_only_its_doc_types(gateway):
    found = ids(gateway.search(QUERY, token({"dao_a": ["guest"]})))
    # Doc and wiki only: the public doc, and the wiki whose ACL allows alice.
    assert found == {"dao_a_pub_doc", "dao_a_acl_alice_wiki"}


# --- document ACLs ---------------------------------------------------------------------------

ACL_DOCS = {
    "dao_a_acl_dev_doc",
    "dao_a_acl_alice_wiki",
    "dao_a_acl_not_ops",
    "dao_a_acl_mixed_conf",
}


@pytest.mark.parametrize(
    ("sub", "groups", "mode", "expected"),
    [
        ("carol", [], "public", {"dao_a_acl_not_ops"}),
        ("alice", [], "public", {"dao_a_acl_not_ops", "dao_a_acl_alice_wiki"}),
        ("carol", ["dev"], "public", {"dao_a_acl_not_ops", "dao_a_acl_dev_doc"}),
        ("carol", ["ops"], "public", set()),
        (
            "carol",
            ["dev"],
            "confidential",
            {"dao_a_acl_not_ops", "dao_a_acl_dev_doc", "dao_a_acl_mixed_conf"},
        ),
        ("bob", [], "confidential", {"dao_a_acl_not_ops", "dao_a_acl_mixed_conf"}),
        # A denied group wins over an allowed group and an allowed user.
        ("bob", ["dev", "board"], "confidential", {"dao_a_acl_not_ops", "dao_a_acl_dev_doc"}),
    ],
)
def test_document_acls_decide_inside_the_team(gateway, sub, groups, mode, expected):
    owner = token({"dao_a": ["owner"]}, sub=sub, groups=groups)
    body = QUERY | {"mode": mode, "top_k": 50}
    response = gateway.search(body, owner)
    assert response.status_code == 200
    assert ids(response) & ACL_DOCS == expected
    # The store was asked with the caller's tokens, so top_k is filled from what it may read.
    flt = gateway.store.searches[-1][1]
    assert "user:" + sub in flt.acl_principals
    assert {"group:" + g for g in groups} <= set(flt.acl_principals)


def test_acl_filtered_search_still_fills_top_k(gateway):
    """The ACL is in the store's filter (not a post-filter): asking for k matches gives k
    readable ones while the team holds that many."""
    owner = token(
        {"dao_a": ["owner"]}, sub="carol", groups=["ops", "board"], permissions=["skill:read"]
    )
    found = gateway.search(QUERY | {"top_k": 3}, owner).json()["matches"]
    assert len(found) == 3
    assert not {m["source_ref"]["id"] for m in found} & (ACL_DOCS - {"dao_a_acl_not_ops"})


def test_doc_type_filter_outside_the_roles_is_403(gateway):
    body = QUERY | {"filters": {"doc_type": ["transaction"]}}
    response = gateway.search(body, token({"dao_a": ["guest"]}))
    assert response.status_code == 403
    assert response.json()["reason"] == "doc_type_not_granted"


def test_project_denied_by_policy_is_403_before_any_search(gateway):
    body = QUERY | {"filters": {"project_id": "prj_ops"}}
    response = gateway.search(body, token())
    assert response.status_code == 403
    assert response.json()["reason"] == "not_in_allowed_groups"
    assert response.json()["fields"][0]["field"] == "filters.project_id"
    assert gateway.store.searches == []
    assert ids(gateway.search(body, token(groups=["ops"]))) == {"dao_a_ops_doc"}


def test_chunks_of_denied_projects_and_skills_are_dropped_from_results(gateway):
    member = ids(gateway.search(QUERY, token()))
    assert not {"dao_a_ops_doc", "dao_a_board_doc", "SKILL-deploy"} & member
    assert "dao_a_pub_doc" in member
    entitled = token(groups=["ops", "board"], permissions=["skill:read"])
    assert {"dao_a_ops_doc", "dao_a_board_doc", "SKILL-deploy"} <= ids(
        gateway.search(QUERY, entitled)
    )


# --- ingestion ---------------------------------------------------------------------------------


def doc(**fields):
    return {"team_id": "dao_a", "doc_id": "new_doc", "text": "fresh Milvus notes", **fields}


def test_member_may_not_ingest_and_nothing_is_written(gateway):
    before = dict(gateway.store.rows)
    response = gateway.ingest([doc()], token())
    assert response.status_code == 403
    assert response.json()["reason"] == "write_not_granted"
    assert gateway.store.rows == before


def test_ingest_into_a_team_not_granted_is_403_and_nothing_is_written(gateway):
    before = dict(gateway.store.rows)
    docs = [doc(), doc(team_id="dao_b", doc_id="sneaky")]
    response = gateway.ingest(docs, token({"dao_a": ["owner"]}))
    assert response.status_code == 403
    assert response.json()["fields"][0]["field"] == "documents.1.team_id"
    assert gateway.store.rows == before


def test_owner_ingests_into_its_team(gateway):
    response = gateway.ingest([doc()], token({"dao_a": ["owner"]}))
    assert response.status_code == 200, response.text
    assert response.json()["indexed"] == 1


# --- API keys ------------------------------------------------------------------------------------


@pytest.fixture
def key_gateway(tmp_path):
    path = tmp_path / "keys.yaml"
    keys = write_api_keys(
        path,
        [
            {"agent_id": "ag_ingest", "teams": {"dao_a": ["service"]}},
            {"teams": {"dao_a": ["owner"]}, "revoked": True},
        ],
    )
    auth = jwt_auth(api_keys_file=str(path), api_key_pepper=PEPPER)
    return build_gateway(auth=auth, policy=TENANCY_POLICY, corpus=tenancy_corpus()), keys


def test_service_api_key_ingests_and_searches_its_team(key_gateway):
    gateway, (key, _) = key_gateway
    assert gateway.ingest([doc()], **{"x-api-key": key}).status_code == 200
    assert gateway.search(QUERY, key).status_code == 200
    response = gateway.search(QUERY | {"team_id": "dao_b"}, **{"x-api-key": key})
    assert response.json()["reason"] == "team_not_granted"


def test_revoked_api_key_is_401(key_gateway):
    gateway, (_, revoked) = key_gateway
    response = gateway.search(QUERY, **{"x-api-key": revoked})
    assert response.status_code == 401
    assert response.json()["message"] == "invalid, revoked or expired API key"


# --- JWKS URL end to end -------------------------------------------------------------------------


def test_rs256_and_es256_tokens_from_a_jwks_url_fetch_the_keys_once():
    keys = ((RSA_KEY, "rsa-1", "RS256"), (EC_KEY, "ec-1", "ES256"))
    with JwksServer(jwks(*keys)) as server:
        gateway = build_gateway(
            auth=jwt_auth(hs256_secret="", jwks_url=server.url),
            policy=TENANCY_POLICY,
            corpus=tenancy_corpus(),
        )
        for key, kid, alg in keys * 3:
            response = gateway.search(
                QUERY, mint(claims(teams=["dao_a"]), key=key, alg=alg, kid=kid)
            )
            assert response.status_code == 200, response.text
        assert server.fetches == 1
        # HS256 is not accepted without a shared secret, whatever it is signed with.
        assert gateway.search(QUERY, token()).status_code == 401


def test_jwks_url_down_is_503_not_401_or_500():
    with JwksServer(jwks((RSA_KEY, "rsa-1", "RS256"))) as server:
        server.down = True
        gateway = build_gateway(auth=jwt_auth(hs256_secret="", jwks_url=server.url))
        response = gateway.search(QUERY, mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-1"))
        assert response.status_code == 503
        assert response.json()["error"] == "backend_unavailable"


# --- the verified-token cache, over HTTP (serve_app/auth/token_cache.py) ---------------------


def test_a_cached_token_is_refused_once_it_expires():
    """The first request puts the token in the cache; once its ``exp`` passes (no leeway
    here) the same token gets 401 'token expired', as it would without the cache."""
    import time

    gw = build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus(), auth=jwt_auth(leeway_s=0))
    assert gw.services.shared.authenticator.verified_tokens is not None  # the cache is on
    expires = int(time.time()) + 2
    short = token(exp=expires)
    assert gw.search(QUERY, short).status_code == 200
    assert gw.search(QUERY, short).status_code == 200  # a hit
    time.sleep(max(0.0, expires - time.time()) + 0.05)
    refused = gw.search(QUERY, short)
    assert refused.status_code == 401
    assert "expired" in refused.json()["message"]


def test_a_cached_tokens_neighbours_are_verified_in_full(gateway):
    """After a genuine token is cached, a copy with one character of its signature or its
    payload changed, or cut short, is refused: only the exact string can hit."""
    genuine = token()
    assert gateway.search(QUERY, genuine).status_code == 200
    header, payload, signature = genuine.split(".")
    flip = {"A": "B", "B": "A"}
    forged = [
        f"{header}.{payload}.{signature[:-2]}{flip.get(signature[-2], 'A')}{signature[-1]}",
        f"{header}.{payload[:-1]}{flip.get(payload[-1], 'A')}.{signature}",
        genuine[:-1],
        genuine + "A",
    ]
    for bad in forged:
        assert bad != genuine
        assert gateway.search(QUERY, bad).status_code == 401, bad
    assert gateway.search(QUERY, genuine).status_code == 200


def test_a_cached_token_answers_with_its_own_teams_only(gateway):
    """Two callers' tokens cached side by side: each still sees only its own team."""
    own_a, own_b = token({"dao_a": ["member"]}), token({"dao_b": ["member"]})
    for _ in range(2):  # the second round from the cache
        assert gateway.search(QUERY, own_a).status_code == 200
        assert gateway.search(QUERY, own_b).status_code == 403
        assert gateway.search({**QUERY, "team_id": "dao_b"}, own_b).status_code == 200
        assert gateway.search({**QUERY, "team_id": "dao_b"}, own_a).status_code == 403
