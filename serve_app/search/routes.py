from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from serve_app.http.deps import Caller
from serve_app.search.contracts import SearchDocsRequest, SearchDocsResponse
from serve_app.search.service import SearchService


async def _search(request: Request) -> SearchService:
    return request.app.state.services.search


Search = Annotated[SearchService, Depends(_search)]

router = APIRouter(tags=["rag"])


@router.post(
    "/rag/search_docs", response_model=SearchDocsResponse, response_model_exclude_none=True
)
async def search_docs(body: SearchDocsRequest, caller: Caller, search: Search) -> Response:
    """rag.search_docs: hybrid search inside the caller's tenant and visibility."""
    response = await search.search_docs(body, caller)
    # Already the declared model: dumped once, as FastAPI would (nulls left out), without
    # the dump, validation and encoding again that FastAPI gives a returned model.
    return Response(response.model_dump_json(exclude_none=True), media_type="application/json")
