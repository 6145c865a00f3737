from __future__ import annotations

from fastapi import APIRouter

from serve_app.api.deps import Caller, Ingest
from serve_app.contracts import IngestDocumentsRequest, IngestDocumentsResponse

router = APIRouter(tags=["ingest"])


@router.post("/ingest/documents", response_model=IngestDocumentsResponse)
async def ingest_documents(body: IngestDocumentsRequest, caller: Caller, ingest: Ingest):
    """Chunk, embed and upsert documents; idempotent per (team_id, doc_type, doc_id)."""
    return await ingest.ingest_documents(body.documents, caller)
