"""Probes of ``GET /audit/decisions``: a caller asks for the access decisions of a team it
was or was not granted (or of none), filtered by decision, subject and limit. Records are
readable by an owner of the team or with the ``audit:read`` permission only; a 200 without
either, or records of another team, is a leak.
"""

from __future__ import annotations

from typing import Any

from tests.security.probe_kit import ENDPOINTS, ProbeKit


class AuditProbes(ProbeKit):
    """Audit probes (over ``search_gw``, the gateway of JWT and API key callers)."""

    search_gw: Any

    def probe_audit(self, kind: str) -> None:
        rng = self.rng
        identity = self.identity()
        headers, expected = self.credential(kind, identity)
        if expected == "dev":
            # Development body trust reads every team's audit outside production (documented);
            # probe it with a valid token instead.
            kind, (headers, expected) = "jwt_valid", self.credential("jwt_valid", identity)
        noisy = rng.random() < 0.5
        params: dict[str, Any] = {}
        if rng.random() < 0.85:
            params["team_id"] = self.team(expected, noisy, kind == "api_key_other_team")
        if rng.random() < 0.3:
            params["decision"] = self.maybe(["allow", "deny"], noisy)
        if rng.random() < 0.3:
            params["limit"] = self.maybe([1, 10, 500, 0, -1], noisy)
        if rng.random() < 0.2:
            params["subject"] = self.maybe(["alice", "bob"], noisy)
        params = {k: v for k, v in params.items() if isinstance(v, (str, int)) and v is not True}
        response = self.search_gw.client.get("/audit/decisions", params=params, headers=headers)
        problem = self.common_failure(expected, response)
        if problem is None and response.status_code == 200:
            team = params.get("team_id")
            everything = "audit:read" in expected["permissions"]
            roles = set(expected["teams"].get(str(team), ())) if team is not None else set()
            if not everything and not (team and "owner" in roles):
                problem = f"audit of team {team!r} readable without a reader role"
            elif not everything:
                others = {d.get("team_id") for d in response.json()["decisions"]} - {team}
                if others:
                    problem = f"audit records of teams {sorted(map(str, others))}"
        self.record(ENDPOINTS[2], kind, response, problem)
