"""``POST /ingest/sync``: a source (a vault, a wiki export) says which of its documents it
still has; every other live document of that source in the team is removed through the
pipeline's delete path (chunks, the graph's ``Doc`` node and what only it made, a tombstone,
the change log, the cache generation), exactly as a ``doc.deleted`` event removes one.

Which documents belong to a source: the ``source_id`` each was last ingested with, as the
source registry records it. Only documents the caller may write are considered: the
others of the source are neither removed nor named (their count goes to the audit log), so
a sync never tells a caller about a document it may not see. Each removal is audited like
an ``ingest.events`` delete (action ``ingest.sync``).
"""

from __future__ import annotations

import asyncio
import time

from batch_ingest.documents import SourceDocument
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.source_store import Key
from deployments.errors import Forbidden, InvalidInput
from serve_app.access.context import AccessContext
from serve_app.access.policy import Policy
from serve_app.audit.recorder import AuditRecorder
from serve_app.ingest.contracts import (
    IngestSyncRequest,
    IngestSyncResponse,
    SyncedDocument,
    SyncKey,
)
from serve_app.request import RequestContext

ACTION = "ingest.sync"


async def source_documents(pipeline: IngestPipeline, team_id: str, source_id: str) -> list:
    """The live documents of ``team_id`` last ingested from ``source_id``."""
    sources = pipeline.sources
    if sources is None:
        raise InvalidInput(
            "syncing a source needs the source registry (state.url); this gateway runs without one",
            field="source_id",
        )

    def scan() -> list[SourceDocument]:
        return [d for d in sources.iter_team(team_id) if d.source_id == source_id]

    return await asyncio.to_thread(scan)


async def sync_source(
    body: IngestSyncRequest,
    rc: RequestContext,
    *,
    pipeline: IngestPipeline,
    policy: Policy,
    recorder: AuditRecorder,
) -> IngestSyncResponse:
    """Remove the documents of ``body.source_id`` in ``body.team_id`` not in ``body.keep``.

    Raises:
        Forbidden: the caller may not write to the team at all.
        InvalidInput: no source registry.
    """
    started = time.perf_counter()
    resource = f"team:{body.team_id}/source:{body.source_id}"
    try:
        ctx = AccessContext.for_team(rc.principal, body.team_id, policy)
        if not policy.may_write(ctx.roles):  # the refusal of an ingest into the team
            ctx.check_write(SourceDocument(team_id=body.team_id, doc_id="-", text="-"), "sync")
    except Forbidden as exc:
        recorder.error(exc, rc.trace_id, rc.principal, rc.started, action=ACTION,
                       team_id=body.team_id, resource=resource, declared_agent_id="")  # fmt: skip
        raise
    known = await source_documents(pipeline, body.team_id, body.source_id)
    keep = {(k.doc_type, k.doc_id.strip()) for k in body.keep}
    writable: list[SourceDocument] = []
    hidden = 0
    for doc in known:
        try:
            ctx.check_write(doc, "sync")
            writable.append(doc)
        except Forbidden:
            hidden += 1
    gone = [d for d in writable if (d.doc_type, d.doc_id) not in keep]
    if hidden:
        recorder.decision(
            rc.trace_id, rc.principal, rc.started, action=ACTION, decision="deny",
            reason="not_writable", http_status=200, team_id=body.team_id,
            resource=f"{resource}/{hidden} documents left alone", declared_agent_id="",
        )  # fmt: skip
    documents: list[SyncedDocument] = []
    degraded: list[str] = []
    if body.dry_run or not gone:
        documents = [SyncedDocument(doc_type=d.doc_type, doc_id=d.doc_id, status="would_delete")
                     for d in gone] if body.dry_run else []  # fmt: skip
    else:
        for doc in gone:
            recorder.decision(
                rc.trace_id, rc.principal, rc.started, action=ACTION, decision="allow",
                reason="granted", http_status=200, team_id=doc.team_id,
                resource=f"{resource}/{doc.doc_type}:{doc.doc_id}/deleted",
                doc_ids=[doc.doc_id], declared_agent_id="",
            )  # fmt: skip
        keys: list[Key] = [(d.team_id, d.doc_type, d.doc_id) for d in gone]
        report = await pipeline.delete(keys)
        degraded = report.degraded
        for r in report.results:
            status = "deleted" if r.status == "deleted" else "failed"
            documents.append(
                SyncedDocument(doc_type=r.doc_type, doc_id=r.doc_id, status=status, error=r.error)
            )
    present = (
        [
            SyncKey(doc_type=d.doc_type, doc_id=d.doc_id)
            for d in writable
            if (d.doc_type, d.doc_id) in keep
        ]
        if body.dry_run
        else []
    )
    failed = sum(d.status == "failed" for d in documents)
    return IngestSyncResponse(
        degraded=bool(degraded or failed),
        degraded_reasons=degraded,
        known=len(writable),
        kept=len(writable) - len(gone),
        removed=sum(d.status == "deleted" for d in documents),
        failed=failed,
        documents=documents,
        present=present,
        dry_run=body.dry_run,
        took_ms=round((time.perf_counter() - started) * 1000, 1),
        trace_id=rc.trace_id,
    )
