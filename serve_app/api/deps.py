"""Dependencies shared by the routes, as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serve_app.auth import Authenticator, Principal
from serve_app.errors import trace_id_of
from serve_app.service import GatewayService


def _service(request: Request) -> GatewayService:
    return request.app.state.service


async def _principal(request: Request) -> Principal:
    """The verified caller; runs before the body is validated, so an unauthenticated request
    gets 401 whatever its body holds."""
    authenticator: Authenticator = request.app.state.authenticator
    return await authenticator.authenticate(request.headers)


Service = Annotated[GatewayService, Depends(_service)]
TraceId = Annotated[str, Depends(trace_id_of)]
CurrentPrincipal = Annotated[Principal, Depends(_principal)]
