"""What every leak probe shares: the credentials an attacker may carry, the random and
adversarial values it fills a request with, and the record of what each probe found.

A probe picks an identity (teams and roles, some of them made up), a credential for it (a
valid JWT or API key, development body trust, or one of the bad ones: expired, not yet
valid, wrong audience or issuer, forged, ``alg: none``, signed over nothing, garbage, cut,
an unknown API key, none at all) and a team to name in the request (one it was granted,
another one, or an adversarial value). ``ProbeKit`` holds these choices and the counters;
the probe families (search_probes, ingest_probes, audit_probes, graph_read_probes,
graph_write_probes) build on it and ``leak_probes.Prober`` joins them.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

ENDPOINTS = (
    "POST /rag/search_docs",
    "POST /ingest/documents",
    "GET /audit/decisions",
    "POST /rag/enrich_answer",
)
BAD_TOKENS = (
    "jwt_expired",
    "jwt_not_yet",
    "jwt_wrong_aud",
    "jwt_wrong_iss",
    "jwt_forged",
    "jwt_alg_none",
    "jwt_hs256_over_nothing",
    "jwt_garbage",
    "jwt_cut",
    "api_key_unknown",
    "no_credential",
)
# Credential kinds and their weights: most probes carry a valid credential, so that enough of
# them reach a 200 and the data that comes back can be checked.
CREDENTIALS = (
    ("jwt_valid", 16),
    ("api_key_valid", 4),
    ("api_key_other_team", 3),
    ("dev_body_trust", 3),
    *((kind, 1) for kind in BAD_TOKENS),
)


def dev_identity(body: dict[str, Any]) -> dict[str, Any]:
    """What development body trust grants: owner of the body's team, no groups or
    permissions, the body's ``user_id`` (or ``dev``) as subject."""
    team = str(body.get("team_id")).strip()
    sub = str(body.get("user_id") or "").strip() or "dev"
    return {"sub": sub, "teams": {team: ["owner"]}, "groups": set(), "permissions": set()}


class ProbeKit:
    """Random inputs, credentials and the leak record of a probe run (the base of every
    probe family; ``leak_probes.Prober`` sets the attributes)."""

    rng: random.Random
    teams: tuple[str, ...]
    adversarial: Any
    corpus: list[dict[str, Any]]
    key_identities: list[tuple[str, dict[str, Any]]]
    runs: Counter[tuple[str, str]]
    statuses: Counter[tuple[str, int]]
    leaks: list[dict[str, Any]]
    server_errors: list[dict[str, Any]]
    checked_matches: int

    # --- random inputs -----------------------------------------------------------------------
    def adv(self) -> Any:
        r = self.rng.random()
        if r < 0.8:
            return self.rng.choice(self.adversarial)
        if r < 0.9:
            return "".join(chr(self.rng.randint(0, 0x2FFF)) for _ in range(self.rng.randint(0, 20)))
        return self.rng.choice([None, 7, [], {}, True, ["dao_a"], {"$ne": ""}])

    def maybe(self, normal: Any, noisy: bool) -> Any:
        """``normal`` (or a choice of it), else an adversarial value one time in five."""
        value = self.rng.choice(normal) if isinstance(normal, (list, tuple)) else normal
        return self.adv() if noisy and self.rng.random() < 0.2 else value

    def identity(self) -> dict[str, Any]:
        rng = self.rng
        teams: dict[str, list[str]] = {}
        for _ in range(rng.randint(1, 3)):
            team = rng.choice(self.teams) if rng.random() < 0.9 else str(self.adv())
            if 0 < len(team) <= 256 and "\x00" not in team:
                roles = ("member", "guest", "owner", "service", "guardian", "visitor")
                teams[team] = rng.sample(roles, rng.randint(1, 3))
        if not teams:
            teams = {rng.choice(self.teams): ["member"]}
        perms = ["skill:read", "memory:read"] + (["audit:read"] if rng.random() < 0.1 else [])
        return {
            "sub": rng.choice(["alice", "bob"]) if rng.random() < 0.9 else str(self.adv()) or "x",
            "teams": teams,
            "groups": set(rng.sample(["ops", "board", "dev"], rng.randint(0, 2))),
            "permissions": set(rng.sample(perms, rng.randint(0, len(perms)))),
            "agent_id": rng.choice(["", "ag_1", "ag_2"]),
        }

    def credential(self, kind: str, identity: dict[str, Any]) -> tuple[dict[str, str], Any]:
        """``(headers, identity the gateway should see)``; the identity is None for a
        credential that must be refused, and ``"dev"`` for development body trust."""
        from serve_app.testing import claims, hmac_token
        from tests.security.test_tenancy_properties import token_for

        if kind == "dev_body_trust":
            return {}, "dev"
        if kind == "no_credential":
            return {}, None
        if kind == "api_key_valid":
            key, ident = self.rng.choice(self.key_identities)
            return {"x-api-key": key}, ident
        if kind == "api_key_other_team":
            # A valid key of some team; the request will name another team (see team()).
            key, ident = self.rng.choice(self.key_identities)
            return {"authorization": f"Bearer {key}"}, ident
        if kind == "api_key_unknown":
            return {"x-api-key": "rgk_" + "".join(self.rng.choices("abcdef0123", k=40))}, None
        if kind == "jwt_hs256_over_nothing":
            payload = claims(sub=identity["sub"], teams=identity["teams"])
            token = hmac_token(payload, b"", {"alg": "HS256", "typ": "JWT"})
        elif kind == "jwt_garbage":
            token = self.rng.choice(["not.a.token", "a.b.c", "....", str(self.adv())[:100]])
        else:
            # valid, expired, not_yet, wrong_aud, wrong_iss, forged, alg_none, cut: the same
            # token recipes as the property tests.
            token = token_for(identity, kind.removeprefix("jwt_"))
        if not token or any(c in token for c in "\r\n\x00") or not token.isascii():
            token = "not.a.token"
        ok = kind == "jwt_valid"
        return {"authorization": f"Bearer {token}"}, identity if ok else None

    def team(self, identity: Any, noisy: bool, other: bool) -> Any:
        granted = sorted(identity["teams"]) if isinstance(identity, dict) else []
        if other:
            foreign = [t for t in self.teams if t not in granted]
            return self.rng.choice(foreign or list(self.teams))
        if not granted or self.rng.random() < 0.15:
            return self.rng.choice(self.teams)
        return self.maybe(granted, noisy)

    # --- checks ------------------------------------------------------------------------------
    def record(self, endpoint: str, category: str, response: Any, problem: str | None) -> None:
        self.runs[(endpoint, category)] += 1
        self.statuses[(endpoint, response.status_code)] += 1
        if response.status_code >= 500:
            self.server_errors.append(
                {
                    "endpoint": endpoint,
                    "category": category,
                    "body": response.text[:300],
                    "request": getattr(response, "request_body", None),
                }
            )
        if problem:
            self.leaks.append(
                {
                    "endpoint": endpoint,
                    "category": category,
                    "status": response.status_code,
                    "problem": problem,
                    "request": getattr(response, "request_body", None),
                    "body": response.text[:800],
                }
            )

    def common_failure(self, expected: Any, response: Any) -> str | None:
        from tests.security.test_tenancy_properties import MARKER

        if expected is None and response.status_code != 401:
            return f"bad credential answered {response.status_code}"
        if response.status_code != 200 and MARKER.findall(response.text):
            return f"markers in a {response.status_code} body"
        return None
