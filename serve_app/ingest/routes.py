from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request
from fastapi.responses import JSONResponse

from serve_app.http.deps import Caller
from serve_app.ingest.contracts import (
    IngestDocumentsRequest,
    IngestDocumentsResponse,
    IngestJobAccepted,
    IngestJobStatus,
    IngestSyncRequest,
    IngestSyncResponse,
)
from serve_app.ingest.service import IngestService


async def _ingest(request: Request) -> IngestService:
    return request.app.state.services.ingest


Ingest = Annotated[IngestService, Depends(_ingest)]

router = APIRouter(tags=["ingest"])


@router.post(
    "/ingest/documents",
    response_model=IngestDocumentsResponse,
    responses={
        202: {
            "model": IngestJobAccepted,
            "description": "too long to index within the request (more than "
            "ingest.sync_max_chars characters), or `Prefer: respond-async` sent: stored and "
            "indexed in the background; poll status_url",
        }
    },
)
async def ingest_documents(
    body: IngestDocumentsRequest,
    caller: Caller,
    ingest: Ingest,
    prefer: Annotated[str | None, Header(description="`respond-async`: always a job")] = None,
) -> IngestDocumentsResponse | JSONResponse:
    """Chunk, embed and upsert documents; idempotent per (team_id, doc_type, doc_id)."""
    prefer_async = "respond-async" in (prefer or "").lower()
    result = await ingest.ingest_documents(body.documents, caller, prefer_async=prefer_async)
    if isinstance(result, IngestJobAccepted):
        return JSONResponse(
            result.model_dump(mode="json"),
            status_code=202,
            headers={"location": result.status_url, "preference-applied": "respond-async"},
        )
    return result


@router.get("/ingest/jobs/{job_id}", response_model=IngestJobStatus)
async def ingest_job(
    job_id: Annotated[str, Path(max_length=64)], caller: Caller, ingest: Ingest
) -> IngestJobStatus:
    """The state of a background ingestion job (queued, running, done with the ingest
    result, or failed with the error); only its submitter sees it."""
    return await ingest.job_status(job_id, caller.principal)


@router.post("/ingest/sync", response_model=IngestSyncResponse)
async def ingest_sync(
    body: IngestSyncRequest, caller: Caller, ingest: Ingest
) -> IngestSyncResponse:
    """Make a source's documents in a team what the source still has: every live document
    last ingested with ``source_id`` that ``keep`` does not list is deleted (chunks, graph,
    registry tombstone, cache), each removal audited; ``dry_run`` lists them instead. Only
    documents the caller may write are touched or named."""
    return await ingest.sync_source(body, caller)
