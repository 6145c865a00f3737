from __future__ import annotations

from fastapi import APIRouter

from serve_app.contracts import EnrichAnswerRequest, EnrichAnswerResponse
from serve_app.http.deps import Caller, Enrich

router = APIRouter(tags=["rag"])


@router.post(
    "/rag/enrich_answer", response_model=EnrichAnswerResponse, response_model_exclude_none=True
)
async def enrich_answer(body: EnrichAnswerRequest, caller: Caller, enrich: Enrich):
    """rag.enrich_answer: cite the caller's documents after the claims of a draft answer, and
    report the claims nothing in the caller's tenant and visibility supports."""
    return await enrich.enrich_answer(body, caller)
