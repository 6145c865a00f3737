"""Rate limits per credential and per team (serve_app/http/rate_limits.py): token buckets in
memory here (tests/integration/test_rate_limits_redis.py shares them in a real Redis)."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.http import rate_limits
from serve_app.http.rate_limits import Limit, RateLimited, RateLimiter
from serve_app.settings import RateLimitSettings
from serve_app.testing import build_gateway, claims, mint


def clock(monkeypatch, start: float = 1_800_000_000.0) -> list[float]:
    now = [start]
    monkeypatch.setattr(rate_limits.time, "time", lambda: now[0])
    return now


def test_a_bucket_admits_its_burst_then_refuses_until_it_refills(monkeypatch):
    now = clock(monkeypatch)
    limiter = RateLimiter(RateLimitSettings(per_credential_per_s=2, per_credential_burst=3))

    async def take() -> None:
        await limiter.admit("cred", [])

    for _ in range(3):
        asyncio.run(take())
    with pytest.raises(RateLimited) as refused:
        asyncio.run(take())
    assert refused.value.status_code == 429
    assert refused.value.reason == "credential_rate_limit"
    assert 0 < refused.value.retry_after_s <= 0.5 + 1e-3  # one token per 0.5 s
    assert refused.value.headers == {"retry-after": "1"}
    now[0] += 0.5
    asyncio.run(take())  # refilled one
    with pytest.raises(RateLimited):
        asyncio.run(take())


def test_a_refused_request_takes_no_token_from_the_team(monkeypatch):
    clock(monkeypatch)
    limiter = RateLimiter(
        RateLimitSettings(
            per_credential_per_s=1,
            per_credential_burst=1,
            per_team_per_s=1,
            per_team_burst=2,
        )
    )
    asyncio.run(limiter.admit("a", ["dao_x"]))
    with pytest.raises(RateLimited):
        asyncio.run(limiter.admit("a", ["dao_x"]))  # the credential's bucket is empty
    asyncio.run(limiter.admit("b", ["dao_x"]))  # the team still had its second token
    with pytest.raises(RateLimited) as team:
        asyncio.run(limiter.admit("c", ["dao_x"]))
    assert team.value.reason == "team_rate_limit" and "dao_x" in team.value.message


def test_fractional_rates_and_a_limit_of_the_profile(monkeypatch):
    now = clock(monkeypatch)
    limiter = RateLimiter(RateLimitSettings())
    slow = Limit(0.5, 1)
    asyncio.run(limiter.admit("agent", [], slow))
    with pytest.raises(RateLimited) as refused:
        asyncio.run(limiter.admit("agent", [], slow))
    assert 1.9 <= refused.value.retry_after_s <= 2.0
    assert refused.value.headers == {"retry-after": "2"}
    now[0] += 2.0
    asyncio.run(limiter.admit("agent", [], slow))


def test_disabled_limits_never_refuse():
    limiter = RateLimiter(RateLimitSettings(enabled=False, per_credential_burst=1))
    for _ in range(5):
        asyncio.run(limiter.admit("cred", ["dao_x"]))


def test_the_local_buckets_are_bounded(monkeypatch):
    monkeypatch.setattr(rate_limits, "MAX_LOCAL_BUCKETS", 10)
    limiter = RateLimiter(RateLimitSettings())
    for i in range(25):
        asyncio.run(limiter.admit(f"cred{i}", []))
    assert len(limiter._local) == 10


# --- through the HTTP routes -------------------------------------------------------------

SEARCH = {"team_id": "dao_greenfood", "query": "milvus"}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_429_with_retry_after_in_the_error_shape_and_audited():
    gateway = build_gateway(rate_limit={"per_credential_per_s": 0.01, "per_credential_burst": 2})
    denials: list[dict] = []
    record = gateway.services.recorder.error
    gateway.services.recorder.error = lambda exc, *a, **f: (denials.append(f), record(exc, *a, **f))
    token = bearer(mint())
    assert [
        gateway.client.post("/rag/search_docs", json=SEARCH, headers=token).status_code
        for _ in range(2)
    ] == [200, 200]
    r = gateway.client.post("/rag/search_docs", json=SEARCH, headers=token)
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    body = r.json()
    assert body["error"] == "rate_limited" and body["reason"] == "credential_rate_limit"
    assert {"message", "hint", "trace_id"} <= set(body)
    assert denials and denials[-1]["action"] == "search" and denials[-1]["denied"] is True
    # Another credential of the same team is not limited by the first one's bucket.
    other = bearer(mint(claims(sub="bob")))
    assert gateway.client.post("/rag/search_docs", json=SEARCH, headers=other).status_code == 200


def test_the_team_bucket_is_shared_by_its_callers_and_not_drained_by_strangers():
    gateway = build_gateway(rate_limit={"per_team_per_s": 0.01, "per_team_burst": 2})
    stranger = bearer(mint(claims(sub="eve", teams={"dao_other": ["owner"]})))
    for _ in range(5):  # a team the credential does not grant: 403, and no token taken
        r = gateway.client.post("/rag/search_docs", json=SEARCH, headers=stranger)
        assert r.status_code == 403
    for sub in ("alice", "bob"):
        r = gateway.client.post(
            "/rag/search_docs", json=SEARCH, headers=bearer(mint(claims(sub=sub)))
        )
        assert r.status_code == 200, r.text
    r = gateway.client.post(
        "/rag/search_docs", json=SEARCH, headers=bearer(mint(claims(sub="carol")))
    )
    assert r.status_code == 429 and r.json()["reason"] == "team_rate_limit"
    # Ingest names its teams per document; the tool routes by X-Team-Id.
    r = gateway.ingest(
        [{"team_id": "dao_greenfood", "doc_id": "d", "text": "t"}], mint(claims(sub="dave"))
    )
    assert r.status_code == 429
    r = gateway.client.post(
        "/tools/rag_search_docs",
        json={"query": "milvus"},
        headers={**bearer(mint(claims(sub="erin"))), "x-team-id": "dao_greenfood"},
    )
    assert r.status_code == 429


def test_an_agent_profile_sets_its_own_rate(tmp_path):
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("agents:\n  agent-slow:\n    requests_per_s: 0.01\n    burst: 1\n")
    gateway = build_gateway(profiles={"file": str(profiles)})
    slow = bearer(mint(claims(agent_id="agent-slow")))
    assert gateway.client.post("/rag/search_docs", json=SEARCH, headers=slow).status_code == 200
    assert gateway.client.post("/rag/search_docs", json=SEARCH, headers=slow).status_code == 429
    fast = bearer(mint(claims(sub="bob", agent_id="agent-fast")))
    for _ in range(3):
        assert gateway.client.post("/rag/search_docs", json=SEARCH, headers=fast).status_code == 200
