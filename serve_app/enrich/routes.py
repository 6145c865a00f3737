from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from serve_app.enrich.contracts import EnrichAnswerRequest, EnrichAnswerResponse
from serve_app.enrich.service import EnrichService
from serve_app.http.deps import Caller


async def _enrich(request: Request) -> EnrichService:
    return request.app.state.services.enrich


Enrich = Annotated[EnrichService, Depends(_enrich)]

router = APIRouter(tags=["rag"])


@router.post(
    "/rag/enrich_answer", response_model=EnrichAnswerResponse, response_model_exclude_none=True
)
async def enrich_answer(
    body: EnrichAnswerRequest, caller: Caller, enrich: Enrich
) -> EnrichAnswerResponse:
    """rag.enrich_answer: cite the caller's documents after the claims of a draft answer, and
    report the claims nothing in the caller's tenant and visibility supports."""
    return await enrich.enrich_answer(body, caller)
