"""AccessContext: who is asking, for which tenant, and what they may see.

It is the only place Milvus filters (``SearchFilter``) are built from. In this first
iteration the identity is taken from the request body (development trust: ``team_id``,
``user_id``, ``agent_id``, privacy ``mode``); verified tokens replace that source without
changing how filters are compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployments.errors import Forbidden
from deployments.protocols import SearchFilter
from serve_app.contracts import SearchDocsRequest, SearchFilters

VISIBILITY_SCOPE = {
    "public": ("public",),
    "confidential": ("public", "confidential"),
}


@dataclass(frozen=True)
class AccessContext:
    team_id: str
    user_id: str = ""
    agent_id: str = ""
    allowed_visibilities: tuple[str, ...] = ("public",)

    @classmethod
    def from_search_request(cls, req: SearchDocsRequest) -> AccessContext:
        return cls(
            team_id=req.team_id,
            user_id=req.user_id,
            agent_id=req.agent_id,
            allowed_visibilities=VISIBILITY_SCOPE[req.visibility],
        )

    def search_filter(self, filters: SearchFilters) -> SearchFilter:
        """Compile validated request filters inside this context's scope.

        Raises:
            Forbidden: when the filters ask for a visibility outside the caller's scope.
        """
        visibilities = self.allowed_visibilities
        if filters.visibility is not None:
            if filters.visibility not in self.allowed_visibilities:
                raise Forbidden(
                    f"filters.visibility={filters.visibility!r} is outside this caller's scope "
                    f"{list(self.allowed_visibilities)}",
                    hint="send mode/visibility 'confidential' with a role that grants it",
                    field="filters.visibility",
                )
            visibilities = (filters.visibility,)
        return SearchFilter(
            team_id=self.team_id,
            visibilities=visibilities,
            project_id=filters.project_id or None,
            channel_id=filters.channel_id or None,
            agent_id=filters.agent_id or None,
            doc_types=tuple(filters.doc_type or ()),
            tags_any=tuple(filters.tags or ()) if filters.tags_mode == "any" else (),
            tags_all=tuple(filters.tags or ()) if filters.tags_mode == "all" else (),
            created_from=filters.created_from,
            created_to=filters.created_to,
        )
