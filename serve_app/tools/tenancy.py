"""Who a tool call acts for. An LLM's arguments never name a team, user or agent: the team
comes from the credential (its only team) or from the router's ``X-Team-Id`` header (which the
credential must still grant: the policy checks it like any body's team_id), the privacy mode
from ``X-Rag-Visibility`` (default public), the user and agent from the credential."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deployments.errors import InvalidInput
from serve_app.auth import Principal

TEAM_HEADERS = ("x-team-id", "x-dao-id", "x-microdao-id")
VISIBILITY_HEADER = "x-rag-visibility"


@dataclass(frozen=True)
class ToolTenancy:
    team_id: str
    visibility: str = "public"

    @classmethod
    def resolve(cls, principal: Principal, headers: Mapping[str, str]) -> ToolTenancy:
        """The team and privacy mode of a tool call.

        Raises:
            InvalidInput: the team is ambiguous (no header, and the credential grants none or
                several teams), two team headers disagree, or the visibility is unknown.
        """
        named = {h: headers[h].strip() for h in TEAM_HEADERS if headers.get(h, "").strip()}
        if len(set(named.values())) > 1:
            raise InvalidInput(
                "X-Team-Id, X-Dao-Id and X-Microdao-Id name one tenant and must agree",
                field="X-Team-Id",
            )
        visibility = headers.get(VISIBILITY_HEADER, "").strip().lower() or "public"
        if visibility not in ("public", "confidential"):
            raise InvalidInput(
                f"X-Rag-Visibility must be public or confidential, not {visibility!r}",
                field="X-Rag-Visibility",
            )
        if named:
            return cls(next(iter(named.values())), visibility)
        teams = list(principal.teams)
        if len(teams) == 1:
            return cls(teams[0], visibility)
        problem = (
            f"the credential grants {len(teams)} teams"
            if teams
            else "the credential names no team of its own"
        )
        raise InvalidInput(
            f"which team? {problem}; send the X-Team-Id header",
            field="X-Team-Id",
            hint="tool arguments never carry the team: the router sets X-Team-Id",
        )
