"""Authentication: HS256 and JWKS (file and URL) tokens, API keys, and the Authenticator."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest
from pydantic import ValidationError

from deployments.errors import BackendUnavailable, Unauthorized
from serve_app.auth import Authenticator
from serve_app.auth.api_keys import ApiKeyStore, hash_key, new_key
from serve_app.auth.tokens import MAX_TOKEN_CHARS, JwksFile, TokenVerifier
from serve_app.settings import AuthSettings, GatewaySettings
from serve_app.testing import (
    AUDIENCE,
    EC_KEY,
    ISSUER,
    PEPPER,
    RSA_KEY,
    SECRET,
    JwksServer,
    claims,
    hmac_token,
    jwks,
    mint,
    unsigned_token,
    write_api_keys,
)

pytestmark = pytest.mark.usefixtures("clean_gateway_env")


def verifier(**overrides: Any) -> TokenVerifier:
    fields = {"hs256_secret": SECRET, "issuer": ISSUER, "audience": AUDIENCE, **overrides}
    return TokenVerifier(AuthSettings(**fields))


def authenticator(**overrides: Any) -> Authenticator:
    fields = {"mode": "jwt", "hs256_secret": SECRET, "issuer": ISSUER, "audience": AUDIENCE}
    return Authenticator.from_settings(GatewaySettings(auth={**fields, **overrides}))


def authenticate(auth: Authenticator, **headers: str):
    return asyncio.run(auth.authenticate(headers))


def refused(verify, token: str) -> str:
    with pytest.raises(Unauthorized) as caught:
        verify(token)
    return caught.value.message


# --- HS256 ---------------------------------------------------------------------------------


def test_valid_hs256_token_gives_its_claims():
    assert verifier().verify(mint())["sub"] == "alice"


def _now_plus(seconds: int):
    """A time claim made when the test runs, not when pytest collected it (a unit run on a
    busy CI machine reached this test ~17 minutes after collection: an ``nbf`` 10 minutes
    ahead at collection was in the past by then)."""
    return lambda: int(time.time()) + seconds


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"exp": _now_plus(-120)}, "expired"),
        ({"nbf": _now_plus(600)}, "not valid yet"),
        ({"iss": "https://evil.example/"}, "issuer"),
        ({"aud": "another-service"}, "audience"),
        ({"iss": None}, "'iss'"),
        ({"aud": None}, "'aud'"),
        ({"exp": None}, "'exp'"),
        ({"sub": None}, "'sub'"),
        ({"exp": "tomorrow"}, "invalid token"),
    ],
    ids=["expired", "nbf-future", "wrong-iss", "wrong-aud", "no-iss", "no-aud", "no-exp", "no-sub",
         "exp-not-a-number"],
)  # fmt: skip
def test_hs256_token_with_bad_claims_is_refused(overrides, expected):
    payload = claims(**{k: v() if callable(v) else v for k, v in overrides.items()})
    assert expected in refused(verifier().verify, mint(payload))


def test_expiry_within_leeway_is_accepted():
    token = mint(claims(exp=int(time.time()) - 5))
    assert verifier(leeway_s=30).verify(token)["sub"] == "alice"
    assert "expired" in refused(verifier(leeway_s=0).verify, token)


def test_token_signed_with_another_secret_is_refused():
    forged = mint(key="another-secret-of-enough-length-0123456789")
    assert "signature" in refused(verifier().verify, forged)


def test_token_with_a_modified_payload_is_refused():
    head, _, signature = mint().split(".")
    other = mint(claims(teams={"dao_other": ["owner"]})).split(".")[1]
    assert "signature" in refused(verifier().verify, f"{head}.{other}.{signature}")


@pytest.mark.parametrize("alg", ["none", "None", "NONE", ""])
def test_alg_none_is_refused(alg):
    token = unsigned_token(claims(), {"alg": alg, "typ": "JWT"})
    assert "not accepted" in refused(verifier().verify, token)


def test_alg_none_cannot_be_configured():
    with pytest.raises(ValidationError, match="unsupported JWT algorithms"):
        AuthSettings(algorithms=["none"])


def test_hs256_refused_when_not_in_accepted_algorithms():
    token = mint()
    assert "not accepted" in refused(verifier(algorithms=["RS256"]).verify, token)


def test_hs256_secret_shorter_than_32_bytes_is_refused():
    with pytest.raises(ValidationError, match="32 bytes"):
        AuthSettings(hs256_secret="short")


@pytest.mark.parametrize(
    "token",
    ["", "garbage", "a.b.c", "a.b", "....", "eyJhbGciOiJIUzI1NiJ9", "é.é.é", "x" * 100],
)
def test_malformed_tokens_are_refused(token):
    assert refused(verifier().verify, token)


def test_truncated_token_is_refused():
    token = mint()
    for cut in (10, len(token) // 2, len(token) - 3):
        assert refused(verifier().verify, token[:cut])


def test_overlong_token_is_refused_before_parsing():
    assert "longer than" in refused(verifier().verify, "a" * (MAX_TOKEN_CHARS + 1))


# --- RS256 / ES256 against a JWKS file and a JWKS URL ---------------------------------------

KEYS = ((RSA_KEY, "rsa-1", "RS256"), (EC_KEY, "ec-1", "ES256"))


@pytest.fixture
def jwks_file(tmp_path):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(*KEYS)))
    return path


@pytest.mark.parametrize(("key", "kid", "alg"), KEYS, ids=["RS256", "ES256"])
def test_jwks_file_verifies_rs256_and_es256(jwks_file, key, kid, alg):
    token = mint(claims(), key=key, alg=alg, kid=kid)
    assert verifier(jwks_file=str(jwks_file)).verify(token)["sub"] == "alice"


@pytest.mark.parametrize(("key", "kid", "alg"), KEYS, ids=["RS256", "ES256"])
def test_jwks_url_verifies_rs256_and_es256(key, kid, alg):
    with JwksServer(jwks(*KEYS)) as server:
        token = mint(claims(), key=key, alg=alg, kid=kid)
        assert verifier(jwks_url=server.url).verify(token)["sub"] == "alice"


def test_jwks_url_is_fetched_once_not_per_request():
    with JwksServer(jwks(*KEYS)) as server:
        check = verifier(jwks_url=server.url)
        for _ in range(5):
            check.verify(mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-1"))
            check.verify(mint(claims(), key=EC_KEY, alg="ES256", kid="ec-1"))
        assert server.fetches == 1


def test_unknown_kid_is_refused_and_refetched_at_most_once_per_cooldown():
    with JwksServer(jwks(*KEYS)) as server:
        check = verifier(jwks_url=server.url, jwks_refresh_cooldown_s=60)
        check.verify(mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-1"))
        for i in range(5):
            token = mint(claims(), key=RSA_KEY, alg="RS256", kid=f"rotated-{i}")
            assert "unknown signing key" in refused(check.verify, token)
        assert server.fetches == 1


def test_rotated_key_is_found_by_a_refetch():
    rotated = (RSA_KEY, "rsa-2", "RS256")
    with JwksServer(jwks(KEYS[0])) as server:
        check = verifier(jwks_url=server.url, jwks_refresh_cooldown_s=0)
        check.verify(mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-1"))
        server.document = jwks(KEYS[0], rotated)
        assert check.verify(mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-2"))
        assert server.fetches == 2


def test_unknown_kid_in_jwks_file_is_refused(jwks_file):
    token = mint(claims(), key=RSA_KEY, alg="RS256", kid="nobody")
    assert "unknown signing key" in refused(verifier(jwks_file=str(jwks_file)).verify, token)


def test_jwks_file_is_reread_when_it_changes(jwks_file):
    check = verifier(jwks_file=str(jwks_file))
    jwks_file.write_text(json.dumps(jwks(*KEYS, (RSA_KEY, "rsa-new", "RS256"))))
    later = time.time() + 10
    os.utime(jwks_file, (later, later))
    assert check.verify(mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-new"))


def test_token_without_kid_is_refused(jwks_file):
    token = mint(claims(), key=RSA_KEY, alg="RS256")
    assert "kid" in refused(verifier(jwks_file=str(jwks_file)).verify, token)


def test_rs256_token_signed_by_an_unknown_key_is_refused(jwks_file):
    from cryptography.hazmat.primitives.asymmetric import rsa

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = mint(claims(), key=other, alg="RS256", kid="rsa-1")
    assert "signature" in refused(verifier(jwks_file=str(jwks_file)).verify, token)


def test_algorithm_confusion_hs256_with_the_public_key_as_secret_is_refused(jwks_file):
    """The classic attack: HMAC over the RSA public key (PEM or JWK) with the JWKS's kid."""
    from cryptography.hazmat.primitives import serialization

    pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}
    forged = hmac_token(claims(), pem, header)
    # With a shared secret configured the HMAC is checked against it, never the public key.
    assert "signature" in refused(verifier(jwks_file=str(jwks_file)).verify, forged)
    # Without one, HS* tokens are not accepted at all.
    no_secret = verifier(jwks_file=str(jwks_file), hs256_secret="")
    assert "no shared secret" in refused(no_secret.verify, forged)
    # And an RS256-only gateway refuses the algorithm outright.
    rs_only = verifier(jwks_file=str(jwks_file), hs256_secret="", algorithms=["RS256"])
    assert "not accepted" in refused(rs_only.verify, forged)


def test_token_alg_must_match_the_keys_alg(jwks_file):
    # Signed with the EC key but claiming the RSA key's kid.
    token = mint(claims(), key=EC_KEY, alg="ES256", kid="rsa-1")
    assert "does not match" in refused(verifier(jwks_file=str(jwks_file)).verify, token)


def test_jwks_url_down_on_first_use_is_503_not_401():
    with JwksServer(jwks(*KEYS)) as server:
        server.down = True
        token = mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-1")
        with pytest.raises(BackendUnavailable, match="jwks"):
            verifier(jwks_url=server.url).verify(token)


def test_jwks_url_down_after_expiry_keeps_verifying_with_the_keys_held():
    with JwksServer(jwks(*KEYS)) as server:
        check = verifier(jwks_url=server.url, jwks_cache_s=0.01, jwks_refresh_cooldown_s=0)
        token = mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-1")
        check.verify(token)
        server.down = True
        time.sleep(0.05)
        assert check.verify(token)["sub"] == "alice"


def test_unreadable_jwks_file_fails_at_start(tmp_path):
    missing = tmp_path / "absent.json"
    with pytest.raises(ValueError, match="jwks_file"):
        verifier(jwks_file=str(missing))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="jwks_file"):
        verifier(jwks_file=str(broken))


# --- API keys ------------------------------------------------------------------------------


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "api_keys.yaml"
    keys = write_api_keys(
        path,
        [
            {"agent_id": "ag_ingest", "teams": {"dao_greenfood": ["service"]}},
            {"teams": {"dao_greenfood": ["service"]}, "revoked": True},
            {"teams": {"dao_greenfood": ["service"]}, "expires_at": "2020-01-01T00:00:00Z"},
        ],
    )
    return path, keys


def test_api_key_gives_its_scoped_principal(key_file):
    path, (valid, _, _) = key_file
    principal = ApiKeyStore(str(path), PEPPER).verify(valid)
    assert principal.method == "api_key"
    assert principal.agent_id == "ag_ingest"
    assert dict(principal.teams) == {"dao_greenfood": ("service",)}
    assert principal.sub == f"apikey:{valid.split('_')[1]}"


def test_api_key_file_stores_no_plaintext_key(key_file):
    path, keys = key_file
    text = path.read_text()
    assert all(key.split("_", 2)[2] not in text for key in keys)


@pytest.mark.parametrize("which", ["revoked", "expired"])
def test_revoked_or_expired_api_key_is_refused(key_file, which):
    path, (_, revoked, expired) = key_file
    key = revoked if which == "revoked" else expired
    with pytest.raises(Unauthorized, match="invalid, revoked or expired"):
        ApiKeyStore(str(path), PEPPER).verify(key)


def test_wrong_secret_unknown_id_and_malformed_keys_are_refused(key_file):
    path, (valid, _, _) = key_file
    store = ApiKeyStore(str(path), PEPPER)
    wrong_secret = valid[:-4] + ("AAAA" if not valid.endswith("AAAA") else "BBBB")
    unknown_id = new_key()[1]
    for key in (wrong_secret, unknown_id, "rgk_", "rgk_x_y", "", "rgk_" + "a" * 5000):
        with pytest.raises(Unauthorized):
            store.verify(key)


def test_api_key_hashed_with_another_pepper_is_refused(key_file):
    path, (valid, _, _) = key_file
    with pytest.raises(Unauthorized):
        ApiKeyStore(str(path), "another pepper").verify(valid)


def test_removing_a_key_from_the_file_revokes_it(key_file):
    path, (valid, _, _) = key_file
    store = ApiKeyStore(str(path), PEPPER, reload_s=0)
    assert store.verify(valid)
    write_api_keys(path, [{"teams": {"dao_greenfood": ["service"]}}])
    later = time.time() + 10
    os.utime(path, (later, later))
    with pytest.raises(Unauthorized):
        store.verify(valid)


def test_hash_is_hmac_sha256_of_the_key_with_the_pepper():
    key = new_key()[1]
    assert hash_key(key, PEPPER).startswith("hmac-sha256:")
    assert hash_key(key, PEPPER) != hash_key(key, PEPPER + "x")


@pytest.mark.parametrize(
    "content",
    [
        "keys: [{id: abcd, hash: 'sha256:00', teams: {t: [r]}}]",
        "keys: [{id: abcd, hash: 'hmac-sha256:" + "0" * 64 + "', teams: {}}]",
        "keys: [{id: abcd, hash: 'hmac-sha256:" + "0" * 64 + "', teams: {t: []}}]",
        "keys: {not: a list}",
        "[unclosed",
    ],
)
def test_invalid_api_key_file_fails_at_start(tmp_path, content):
    path = tmp_path / "keys.yaml"
    path.write_text(content)
    with pytest.raises(ValueError, match="api_keys_file"):
        ApiKeyStore(str(path), PEPPER)


# --- Authenticator: headers and modes ------------------------------------------------------


def test_bearer_jwt_gives_principal_with_teams_and_roles():
    principal = authenticate(authenticator(), authorization=f"Bearer {mint()}")
    assert principal.method == "jwt"
    assert principal.sub == "alice"
    assert principal.roles_in("dao_greenfood") == ("member",)
    assert principal.roles_in("dao_other") == ()


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_api_key_accepted_as_bearer_or_x_api_key(tmp_path, header):
    path = tmp_path / "keys.yaml"
    (key,) = write_api_keys(path, [{"teams": {"dao_greenfood": ["service"]}}])
    auth = authenticator(api_keys_file=str(path), api_key_pepper=PEPPER)
    value = f"Bearer {key}" if header == "authorization" else key
    assert authenticate(auth, **{header: value}).method == "api_key"


def test_api_key_refused_when_no_key_file_is_configured():
    with pytest.raises(Unauthorized, match="API keys are not accepted"):
        authenticate(authenticator(), **{"x-api-key": new_key()[1]})


def test_missing_credentials_in_jwt_mode_is_401_without_error_code():
    with pytest.raises(Unauthorized) as caught:
        authenticate(authenticator())
    assert caught.value.message == "credentials required"
    assert caught.value.headers["WWW-Authenticate"] == 'Bearer realm="rag-gateway"'


@pytest.mark.parametrize(
    "value", ["Basic YWxpY2U6c2VjcmV0", "Bearer", "Bearer ", "Token abc", "bearer"]
)
def test_non_bearer_authorization_is_refused(value):
    with pytest.raises(Unauthorized, match="Bearer"):
        authenticate(authenticator(), authorization=value)


def test_two_credentials_at_once_are_refused():
    with pytest.raises(Unauthorized, match="one credential"):
        authenticate(authenticator(), authorization=f"Bearer {mint()}", **{"x-api-key": "rgk_a_b"})


def test_dev_mode_without_credentials_trusts_the_body_with_dev_roles(caplog):
    with caplog.at_level("WARNING"):
        auth = authenticator(mode="dev")
    assert "AUTH MODE dev" in caplog.text
    principal = authenticate(auth)
    assert principal.trusts_body
    assert principal.roles_in("any_team") == ("owner",)


def test_dev_mode_still_verifies_credentials_that_are_sent():
    auth = authenticator(mode="dev")
    with pytest.raises(Unauthorized):
        authenticate(auth, authorization="Bearer forged.token.here")
    assert authenticate(auth, authorization=f"Bearer {mint()}").method == "jwt"


def test_dev_mode_without_any_verifier_refuses_a_sent_token():
    auth = Authenticator.from_settings(GatewaySettings(auth={"mode": "dev"}))
    with pytest.raises(Unauthorized, match="not accepted here"):
        authenticate(auth, authorization=f"Bearer {mint()}")


def test_unexpected_error_in_a_verifier_is_a_401_not_a_500(monkeypatch):
    auth = authenticator()

    def broken(token: str) -> dict:
        raise RuntimeError("bug")

    monkeypatch.setattr(auth.tokens, "verify", broken)
    with pytest.raises(Unauthorized, match="could not be verified"):
        authenticate(auth, authorization=f"Bearer {mint()}")


# --- settings ------------------------------------------------------------------------------


def test_jwt_mode_without_any_credential_source_is_refused():
    with pytest.raises(ValidationError, match="AUTH__JWKS_URL"):
        AuthSettings(mode="jwt")


def test_dev_mode_is_refused_in_production():
    with pytest.raises(ValidationError, match="AUTH__MODE=jwt"):
        GatewaySettings(environment="production", neo4j={"password": "a-real-secret"})


def test_production_needs_issuer_and_audience_for_tokens():
    with pytest.raises(ValidationError, match="AUTH__ISSUER"):
        GatewaySettings(
            environment="production",
            neo4j={"password": "a-real-secret"},
            auth={"mode": "jwt", "jwks_url": "https://id.example.org/jwks"},
        )


def test_production_needs_a_pepper_for_api_keys():
    with pytest.raises(ValidationError, match="PEPPER"):
        GatewaySettings(
            environment="production",
            neo4j={"password": "a-real-secret"},
            auth={"mode": "jwt", "api_keys_file": "/etc/rag/keys.yaml"},
        )


def test_auth_settings_come_from_nested_env(monkeypatch):
    monkeypatch.setenv("AUTH__MODE", "jwt")
    monkeypatch.setenv("AUTH__HS256_SECRET", SECRET)
    monkeypatch.setenv("AUTH__CLAIMS__TEAMS", "https://example.org/teams")
    monkeypatch.setenv("AUTH__ALGORITHMS", '["RS256", "ES256"]')
    auth = GatewaySettings().auth
    assert auth.mode == "jwt"
    assert auth.hs256_secret.get_secret_value() == SECRET
    assert auth.claims.teams == "https://example.org/teams"
    assert auth.algorithms == ["RS256", "ES256"]
    assert SECRET not in repr(auth)


def test_a_key_removed_from_the_jwks_file_stops_verifying(jwks_file):
    """Revoking a signing key by deleting it from the file: tokens of that key are refused
    within ``recheck_s`` of the change, though no unknown key id ever asks for a re-read."""
    now = [0.0]
    check = verifier(jwks_file=str(jwks_file))
    check.jwks_file = JwksFile(str(jwks_file), recheck_s=1.0, clock=lambda: now[0])
    token = mint(claims(), key=RSA_KEY, alg="RS256", kid="rsa-1")
    assert check.verify(token)["sub"] == "alice"
    jwks_file.write_text(json.dumps(jwks(KEYS[1])))  # rsa-1 revoked
    later = time.time() + 10
    os.utime(jwks_file, (later, later))
    now[0] = 0.5  # inside the recheck window: the held key still answers
    assert check.verify(token)["sub"] == "alice"
    now[0] = 1.5
    assert "unknown signing key" in refused(check.verify, token)
    # The key that stayed still verifies.
    assert check.verify(mint(claims(), key=EC_KEY, alg="ES256", kid="ec-1"))["sub"] == "alice"
