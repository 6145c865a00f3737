"""GET /admin/usage: the embedding ledger (batch_ingest/usage.py) — passage tokens and chunks
embedded per team, source (api, bus, reindex, bulk) and UTC day, whichever process embedded them.

Who may read it: the same right as the audit log (``audit.read_permission`` for every team,
or one of ``audit.reader_roles`` in the ``team_id`` asked for); audited as ``usage.read``."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Query, Request

from serve_app.http.deps import Caller
from serve_app.ops.contracts import EmbeddingUsageResponse
from serve_app.ops.deps import Ops

router = APIRouter(tags=["ops"])


@router.get("/admin/usage")
async def embedding_usage(
    request: Request,
    caller: Caller,
    ops: Ops,
    team_id: Annotated[str | None, Query(max_length=256)] = None,
    since: Annotated[
        date | None, Query(description="first UTC day, YYYY-MM-DD; not after `until` (422)")
    ] = None,
    until: Annotated[date | None, Query(description="last UTC day, YYYY-MM-DD")] = None,
) -> EmbeddingUsageResponse:
    """Embedded tokens and chunks per team, source and day, with totals per team. ``since``
    after ``until`` is a 422 (a schema cannot compare two parameters)."""
    return await ops.embedding_usage(
        caller, request.url.path, team_id=team_id, since=since, until=until
    )
