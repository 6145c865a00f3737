"""The dependency the operator routes read their service through."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serve_app.ops.service import OpsService


# Async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop
# on every request for a single attribute read.
async def _ops(request: Request) -> OpsService:
    return request.app.state.services.ops


Ops = Annotated[OpsService, Depends(_ops)]
