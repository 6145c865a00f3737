"""Dependencies shared by the routes, as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serve_app.errors import trace_id_of
from serve_app.service import GatewayService


def _service(request: Request) -> GatewayService:
    return request.app.state.service


Service = Annotated[GatewayService, Depends(_service)]
TraceId = Annotated[str, Depends(trace_id_of)]
