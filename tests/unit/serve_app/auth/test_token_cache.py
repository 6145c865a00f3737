"""The cache of verified JWTs (serve_app/auth/token_cache.py), tried the way an attacker would:
only the exact token string hits, expiry is re-checked on every hit exactly as PyJWT checks it,
a verification is trusted at most ``auth.token_cache_s``, failures are never kept, the size is
bounded, and threads sharing it get the right principals."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jwt.api_jwt
import pytest

from deployments.errors import Unauthorized
from serve_app.auth import Authenticator
from serve_app.auth import authenticator as authenticator_module
from serve_app.auth.api_keys import ApiKeyStore
from serve_app.auth.principal import Principal
from serve_app.auth.token_cache import VerifiedTokens
from serve_app.auth.tokens import TokenVerifier
from serve_app.settings import GatewaySettings
from serve_app.testing import (
    EC_KEY,
    PEPPER,
    RSA_KEY,
    JwksServer,
    claims,
    jwks,
    jwt_auth,
    mint,
    write_api_keys,
)

pytestmark = pytest.mark.usefixtures("clean_gateway_env")

T0 = 1_900_000_000  # the fake clock's start (2030); tokens are minted around it


class Clock:
    """One fake time for the cache and for PyJWT's own expiry checks."""

    def __init__(self, now: float = T0) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()

    class FakeDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Any:
            return dt.datetime.fromtimestamp(fake.now, tz)

    monkeypatch.setattr(jwt.api_jwt, "datetime", FakeDatetime)
    return fake


def at(clock: Clock, **overrides: Any) -> dict[str, Any]:
    """Claims of a token valid at the fake clock's time (exp an hour later)."""
    now = int(clock.now)
    return claims(**{"iat": now, "nbf": now, "exp": now + 3600, **overrides})


class Counting(TokenVerifier):
    """A TokenVerifier that counts full verifications (from any thread)."""

    calls = 0
    _count_lock = threading.Lock()

    def verify(self, token: str) -> dict[str, Any]:
        with self._count_lock:
            self.calls += 1
        return super().verify(token)


def make(clock: Clock | None = None, **overrides: Any) -> tuple[Authenticator, Counting]:
    auth = GatewaySettings(auth=jwt_auth(**overrides)).auth
    tokens = Counting(auth)
    kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
    return Authenticator(auth, tokens=tokens, **kwargs), tokens


def authenticate(auth: Authenticator, token: str) -> Principal:
    return asyncio.run(auth.authenticate({"authorization": f"Bearer {token}"}))


def refused(auth: Authenticator, token: str) -> str:
    with pytest.raises(Unauthorized) as caught:
        authenticate(auth, token)
    return caught.value.message


# --- 1. a hit ------------------------------------------------------------------------------


def test_same_token_twice_is_verified_once_and_gives_an_equal_principal(clock, monkeypatch):
    auth, tokens = make(clock)
    decodes = 0
    real_decode = jwt.decode

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        nonlocal decodes
        decodes += 1
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting_decode)
    token = mint(at(clock, groups=["g1"]))
    first = authenticate(auth, token)
    clock.now += 1
    second = authenticate(auth, token)
    assert (tokens.calls, decodes) == (1, 1)
    assert second == first
    assert second.sub == "alice" and second.method == "jwt"
    assert second.teams == {"dao_greenfood": ("member",)}
    assert second.groups == frozenset({"g1"})


def test_the_default_settings_turn_the_cache_on_and_from_settings_uses_it():
    auth = Authenticator.from_settings(GatewaySettings(auth=jwt_auth()))
    assert auth.verified_tokens is not None
    assert (auth.verified_tokens.size, auth.verified_tokens.trust_s) == (4096, 60.0)
    authenticate(auth, mint())
    assert len(auth.verified_tokens) == 1


# --- 2. only the exact token string hits ---------------------------------------------------


def test_a_signature_with_one_character_changed_is_refused_right_after_the_genuine_token(clock):
    auth, tokens = make(clock)
    token = mint(at(clock))
    authenticate(auth, token)
    head_body, _, signature = token.rpartition(".")
    # Every character but the last (whose low bits are base64 padding) changes the signature.
    for i in range(len(signature) - 1):
        flipped = "A" if signature[i] != "A" else "B"
        forged = f"{head_body}.{signature[:i]}{flipped}{signature[i + 1 :]}"
        before = tokens.calls
        assert refused(auth, forged) == "token signature does not verify"
        assert tokens.calls == before + 1
    # The genuine token is still a hit; the forgeries left nothing behind.
    before = tokens.calls
    assert authenticate(auth, token).sub == "alice"
    assert tokens.calls == before
    assert len(auth.verified_tokens or ()) == 1


def test_a_token_differing_in_any_character_is_verified_in_full(clock):
    auth, tokens = make(clock)
    token = mint(at(clock))
    authenticate(auth, token)
    for i in range(len(token)):
        if token[i] == ".":
            continue
        variant = token[:i] + ("x" if token[i] != "x" else "y") + token[i + 1 :]
        before = tokens.calls
        with contextlib.suppress(Unauthorized):
            authenticate(auth, variant)
        assert tokens.calls == before + 1, f"character {i} of the token changed and it hit"
    for variant in (token + "A", token[:-1], " " + token, token.upper()):
        before = tokens.calls
        with pytest.raises(Unauthorized):
            auth._verify("jwt", variant)
        assert tokens.calls == before + 1


def test_another_valid_token_of_the_same_subject_is_a_miss_with_its_own_claims(clock):
    auth, tokens = make(clock)
    member = authenticate(auth, mint(at(clock)))
    owner = authenticate(auth, mint(at(clock, teams={"dao_greenfood": ["owner"]})))
    assert tokens.calls == 2
    assert member.roles_in("dao_greenfood") == ("member",)
    assert owner.roles_in("dao_greenfood") == ("owner",)


# --- 3. expiry is re-checked on every hit, as PyJWT checks it ------------------------------


def test_a_cached_token_past_exp_plus_leeway_is_refused_as_expired(clock):
    auth, tokens = make(clock, leeway_s=30, token_cache_s=3600)
    token = mint(at(clock, exp=T0 + 100))
    authenticate(auth, token)
    clock.now = T0 + 129.999
    assert authenticate(auth, token).sub == "alice"
    assert tokens.calls == 1
    clock.now = T0 + 130  # exp <= now - leeway: PyJWT's "expired"
    assert refused(auth, token) == "token expired"
    assert tokens.calls == 2
    assert len(auth.verified_tokens or ()) == 0
    assert refused(auth, token) == "token expired"
    assert tokens.calls == 3


@pytest.mark.parametrize("leeway", [0, 0.5, 30])
@pytest.mark.parametrize("exp", [T0 + 10, "1900000010", 1_900_000_010.9])
def test_a_hit_is_served_exactly_while_pyjwt_would_accept_the_token(clock, leeway, exp):
    """Around the expiry boundary, the cached answer equals a full verification's."""
    cached, cached_tokens = make(clock, leeway_s=leeway, token_cache_s=3600)
    fresh, _ = make(clock, leeway_s=leeway, token_cache_size=0)
    token = mint(at(clock, exp=exp))
    authenticate(cached, token)
    for offset in (9, 9.5, 9.999, 10, 10.0001, 10.4999, 10.5, 10.9, 11, 40, 45):
        clock.now = T0 + offset
        expected = _outcome(fresh, token)
        assert _outcome(cached, token) == expected, (offset, leeway, exp)
    assert cached_tokens.calls > 1  # the expired hits went to PyJWT


def _outcome(auth: Authenticator, token: str) -> str:
    try:
        return authenticate(auth, token).sub
    except Unauthorized as exc:
        return exc.message


def test_a_clock_that_went_back_before_the_verification_is_a_miss(clock):
    auth, tokens = make(clock)
    token = mint(at(clock))
    authenticate(auth, token)
    clock.now -= 5
    authenticate(auth, token)
    assert tokens.calls == 2


# --- 4. a verification is trusted at most token_cache_s ------------------------------------


def test_after_token_cache_s_the_token_is_verified_again_and_a_changed_secret_refuses_it(clock):
    auth, tokens = make(clock, token_cache_s=60)
    token = mint(at(clock))
    authenticate(auth, token)
    clock.now = T0 + 59.9
    authenticate(auth, token)
    assert tokens.calls == 1
    clock.now = T0 + 60
    authenticate(auth, token)
    assert tokens.calls == 2  # re-verified, and trusted again from T0 + 60
    # The secret is rotated: within the window the cached verification still holds ...
    assert auth.tokens is not None
    auth.tokens.secret = "another-hs256-shared-secret-0123456789abcdef"
    clock.now = T0 + 119.9
    authenticate(auth, token)
    assert tokens.calls == 2
    # ... and at most token_cache_s after the last verification it is refused.
    clock.now = T0 + 120
    assert refused(auth, token) == "token signature does not verify"
    assert tokens.calls == 3
    assert refused(auth, token) == "token signature does not verify"
    assert tokens.calls == 4


def test_a_key_removed_from_the_jwks_url_stops_verifying_once_the_entry_is_stale(clock):
    keys = jwks((RSA_KEY, "rsa-1", "RS256"))
    with JwksServer(keys) as server:
        auth, tokens = make(clock, hs256_secret="", jwks_url=server.url, token_cache_s=60)
        token = mint(at(clock), key=RSA_KEY, alg="RS256", kid="rsa-1")
        assert authenticate(auth, token).sub == "alice"
        # The provider rotates rsa-1 out; the key set held runs out (auth.jwks_cache_s).
        server.document = jwks((EC_KEY, "ec-2", "ES256"))
        assert auth.tokens is not None and auth.tokens.jwks_client is not None
        cache = auth.tokens.jwks_client.jwk_set_cache
        assert cache is not None
        cache.put(None)
        clock.now = T0 + 30
        assert authenticate(auth, token).sub == "alice"  # within token_cache_s
        clock.now = T0 + 60
        assert refused(auth, token) == "unknown signing key id 'rsa-1'"
        assert tokens.calls == 2


def test_a_hit_needs_neither_may_fetch_nor_a_thread(clock, monkeypatch):
    with JwksServer(jwks((RSA_KEY, "rsa-1", "RS256"))) as server:
        auth, tokens = make(clock, hs256_secret="", jwks_url=server.url)
        hops = 0
        real_to_thread = asyncio.to_thread

        async def counting_to_thread(*args: Any, **kwargs: Any) -> Any:
            nonlocal hops
            hops += 1
            return await real_to_thread(*args, **kwargs)

        monkeypatch.setattr(authenticator_module.asyncio, "to_thread", counting_to_thread)
        assert auth.tokens is not None
        fetch_checks = 0
        real_may_fetch = auth.tokens.may_fetch

        def counting_may_fetch(token: str) -> bool:
            nonlocal fetch_checks
            fetch_checks += 1
            return True  # as if the key set had to be fetched every time

        monkeypatch.setattr(auth.tokens, "may_fetch", counting_may_fetch)
        token = mint(at(clock), key=RSA_KEY, alg="RS256", kid="rsa-1")
        assert authenticate(auth, token).sub == "alice"
        assert (hops, fetch_checks, tokens.calls, server.fetches) == (1, 1, 1, 1)
        for _ in range(3):
            assert authenticate(auth, token).sub == "alice"
        assert (hops, fetch_checks, tokens.calls, server.fetches) == (1, 1, 1, 1)
        assert real_may_fetch(token) is False


# --- 5. the size bound ---------------------------------------------------------------------


def test_at_most_token_cache_size_entries_least_recently_used_go_first(clock):
    auth, tokens = make(clock, token_cache_size=3)
    t1, t2, t3, t4, t5 = (mint(at(clock, sub=f"user{i}")) for i in range(1, 6))
    for token in (t1, t2, t3):
        authenticate(auth, token)
    assert tokens.calls == 3
    authenticate(auth, t1)  # t1 used again: t2 is now the least recently used
    assert tokens.calls == 3
    authenticate(auth, t4)
    assert len(auth.verified_tokens or ()) == 3
    for token in (t1, t3, t4):
        authenticate(auth, token)
    assert tokens.calls == 4  # t1, t3, t4 still held
    authenticate(auth, t2)
    assert tokens.calls == 5  # t2 was evicted (it evicts t1 now: t3, t4, t1 were used after)
    authenticate(auth, t5)
    assert tokens.calls == 6
    assert len(auth.verified_tokens or ()) == 3
    for token in (t2, t5):
        authenticate(auth, token)
    assert tokens.calls == 6


def test_many_distinct_tokens_never_hold_more_than_the_size():
    cache = VerifiedTokens(5, 60, 0, clock=lambda: T0)
    principal = Principal(sub="x", method="jwt")
    for i in range(50):
        cache.put(f"token-{i}", principal, {"exp": T0 + 100}, T0)
        assert len(cache) <= 5
    assert [cache.get(f"token-{i}") for i in range(45, 50)] == [principal] * 5
    assert cache.get("token-44") is None


# --- 6. off ----------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", [{"token_cache_size": 0}, {"token_cache_s": 0}])
def test_a_cache_switched_off_verifies_every_call(clock, setting):
    auth, tokens = make(clock, **setting)
    assert auth.verified_tokens is None
    token = mint(at(clock))
    for _ in range(5):
        assert authenticate(auth, token).sub == "alice"
    assert tokens.calls == 5


def test_negative_settings_are_refused():
    for setting in ({"token_cache_size": -1}, {"token_cache_s": -1}):
        with pytest.raises(ValueError):
            GatewaySettings(auth=jwt_auth(**setting))


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("AUTH__TOKEN_CACHE_SIZE", "7")
    monkeypatch.setenv("AUTH__TOKEN_CACHE_S", "2.5")
    auth = GatewaySettings().auth
    assert (auth.token_cache_size, auth.token_cache_s) == (7, 2.5)


# --- 7. failures are never kept --------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"exp": None},  # no exp
        {"exp": T0 - 3600},  # expired
        {"nbf": T0 + 3600},  # not valid yet
        {"teams": 42},  # verifies, but its claims do not make a principal
    ],
    ids=["no-exp", "expired", "nbf-future", "bad-teams-claim"],
)
def test_a_refused_token_costs_a_full_verification_every_time(clock, payload):
    auth, tokens = make(clock)
    token = mint(at(clock, **payload))
    first = refused(auth, token)
    assert refused(auth, token) == first
    assert tokens.calls == 2
    assert len(auth.verified_tokens or ()) == 0


def test_a_forged_token_costs_a_full_verification_every_time(clock):
    auth, tokens = make(clock)
    forged = mint(at(clock), key="an-attackers-own-secret-of-32-bytes-or-more")
    for _ in range(3):
        assert refused(auth, forged) == "token signature does not verify"
    assert tokens.calls == 3
    assert len(auth.verified_tokens or ()) == 0


def test_api_keys_are_not_cached(tmp_path, monkeypatch):
    path = tmp_path / "keys.yaml"
    (key,) = write_api_keys(path, [{"teams": {"dao_greenfood": ["service"]}}])
    settings = GatewaySettings(auth=jwt_auth(api_keys_file=str(path), api_key_pepper=PEPPER))
    auth = Authenticator.from_settings(settings)
    checks = 0
    real_verify = ApiKeyStore.verify

    def counting(store: ApiKeyStore, key: str) -> Principal:
        nonlocal checks
        checks += 1
        return real_verify(store, key)

    monkeypatch.setattr(ApiKeyStore, "verify", counting)
    for _ in range(3):
        principal = asyncio.run(auth.authenticate({"x-api-key": key}))
        assert principal.method == "api_key"
    assert checks == 3
    assert len(auth.verified_tokens or ()) == 0


# --- 8. threads ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 4096], ids=["evicting", "roomy"])
def test_threads_sharing_the_cache_get_the_right_principals(clock, size):
    # 4 is smaller than the mix of 6 good tokens: evictions race hits.
    auth, tokens = make(clock, token_cache_size=size)
    good = {f"user{i}": mint(at(clock, sub=f"user{i}")) for i in range(6)}
    bad = [
        mint(at(clock), key="an-attackers-own-secret-of-32-bytes-or-more"),
        mint(at(clock, exp=T0 - 3600)),
        mint(at(clock, sub="user0", teams=42)),
        "not.a.token",
    ]
    work = [(sub, token) for sub, token in good.items()] * 40 + [(None, t) for t in bad] * 15
    random.Random(0).shuffle(work)
    errors: list[str] = []
    lock = threading.Lock()

    def check(item: tuple[str | None, str]) -> None:
        sub, token = item
        try:
            outcome: str | None = auth._verify("jwt", token).sub
        except Unauthorized:
            outcome = None
        if outcome != sub:
            with lock:
                errors.append(f"{sub!r} got {outcome!r}")

    async def on_the_loop() -> None:
        for sub, token in work[:60]:
            try:
                principal = await auth.authenticate({"authorization": f"Bearer {token}"})
                outcome: str | None = principal.sub
            except Unauthorized:
                outcome = None
            assert outcome == sub

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(check, item) for item in work]
        asyncio.run(on_the_loop())
        for future in futures:
            future.result()
    assert errors == []
    assert len(auth.verified_tokens or ()) <= min(size, len(good))
    bad_calls = sum(1 for sub, _ in work + work[:60] if sub is None)
    if size >= len(good):
        # Each good token is verified by at most the threads that missed it at once.
        assert bad_calls <= tokens.calls <= bad_calls + len(good) * 9
    else:
        assert tokens.calls < len(work) + 60
