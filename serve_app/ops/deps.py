"""The dependency the operator routes read ``GatewayService`` through (moved from
serve_app/http/deps.py, whose shared dependencies import no feature)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serve_app.service import GatewayService


# Async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop
# on every request for a single attribute read.
async def _service(request: Request) -> GatewayService:
    return request.app.state.service


Service = Annotated[GatewayService, Depends(_service)]
