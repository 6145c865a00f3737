from __future__ import annotations

from fastapi import APIRouter

from serve_app.contracts import SearchDocsRequest, SearchDocsResponse
from serve_app.http.deps import Caller, Search

router = APIRouter(tags=["rag"])


@router.post(
    "/rag/search_docs", response_model=SearchDocsResponse, response_model_exclude_none=True
)
async def search_docs(body: SearchDocsRequest, caller: Caller, search: Search):
    """rag.search_docs: hybrid search inside the caller's tenant and visibility."""
    return await search.search_docs(body, caller)
