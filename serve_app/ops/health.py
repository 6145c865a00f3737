from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from serve_app.ops.deps import Ops
from serve_app.ops.surface import readiness_view

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the ingress process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, ops: Ops) -> JSONResponse:
    """Readiness: 200 when the model is loaded and Milvus and Neo4j answer, else 503 naming
    them (in production without details unless the caller may see them)."""
    ready, body = await ops.readiness()
    view = await readiness_view(request, body)
    return JSONResponse(status_code=200 if ready else 503, content=view)
