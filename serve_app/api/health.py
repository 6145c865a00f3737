from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serve_app.api.deps import Service

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the ingress process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(service: Service) -> JSONResponse:
    """Readiness: 200 when the model is loaded and Milvus and Neo4j answer, else 503 naming them."""
    ready, body = await service.readiness()
    return JSONResponse(status_code=200 if ready else 503, content=body)
