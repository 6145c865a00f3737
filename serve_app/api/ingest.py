from __future__ import annotations

from fastapi import APIRouter

from serve_app.api.deps import CurrentPrincipal, Service, TraceId
from serve_app.contracts import IngestDocumentsRequest, IngestDocumentsResponse

router = APIRouter(tags=["ingest"])


@router.post("/ingest/documents", response_model=IngestDocumentsResponse)
async def ingest_documents(
    body: IngestDocumentsRequest, principal: CurrentPrincipal, service: Service, trace_id: TraceId
):
    """Chunk, embed and upsert documents; idempotent per (team_id, doc_type, doc_id)."""
    return await service.ingest_documents(body.documents, trace_id, principal)
