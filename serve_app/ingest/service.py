"""Ingestion over HTTP (``POST /ingest/documents``, ``POST /ingest/events``): the caller's
write rights and the request limits checked first, every document's decision audited, then
the idempotent pipeline (batch_ingest/pipeline.py, batch_ingest/events/)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from batch_ingest.documents import SourceDocument
from batch_ingest.events import (
    IngestEventsResponse,
    InvalidEvent,
    MappedEvent,
    apply_events,
    count_statuses,
)
from batch_ingest.ingest_report import IngestReport
from batch_ingest.jobs import IngestJob, IngestJobs
from batch_ingest.pipeline import IngestPipeline
from deployments.errors import Forbidden, InvalidInput, NotFound
from serve_app.access.context import AccessContext, check_ingest
from serve_app.access.policy import Policy
from serve_app.audit.recorder import AuditRecorder
from serve_app.auth.principal import Principal
from serve_app.ingest.contracts import (
    IngestDocumentsResponse,
    IngestedDocument,
    IngestJobAccepted,
    IngestJobStatus,
    IngestSyncRequest,
    IngestSyncResponse,
)
from serve_app.ingest.sync import sync_source
from serve_app.ingest.worker import JobWorker
from serve_app.request import RequestContext
from serve_app.settings import GatewaySettings


@dataclass
class IngestService:
    settings: GatewaySettings
    policy: Policy
    pipeline: IngestPipeline
    recorder: AuditRecorder
    # Background jobs (batch_ingest/jobs.py) for requests too long to index within one HTTP
    # request; None (no state database) indexes every request inline.
    jobs: IngestJobs | None = None
    worker: JobWorker | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # The worker runs this service's own job method: wired here, not in the composition.
        if self.jobs is not None:
            self.worker = JobWorker(
                self.jobs, self._run_job, lease_s=self.settings.ingest.job_lease_s
            )

    async def ingest_documents(
        self, docs: list[SourceDocument], rc: RequestContext, *, prefer_async: bool = False
    ) -> IngestDocumentsResponse | IngestJobAccepted:
        """Index ``docs`` after checking that the caller (``rc.principal``) may write every one
        of them. A request of more than ``ingest.sync_max_chars`` characters, or any request
        with ``prefer_async``, is stored as a background job instead and answered with its
        id (``IngestJobAccepted``, HTTP 202) when the gateway has a state database.

        Raises:
            Forbidden: a document's team, doc type, visibility or project is not writable by
                the caller; nothing is written then.
            InvalidInput: too many documents or a document too long.
        """
        trace_id, principal, started = rc.trace_id, rc.principal, rc.started
        try:
            contexts = check_ingest(principal, docs, self.policy)
        except Forbidden as exc:
            doc = _failing_document(exc, docs)
            self.recorder.error(
                exc,
                trace_id,
                principal,
                started,
                action="ingest",
                team_id=doc.team_id if doc else "",
                resource=_doc_resource(doc) if doc else "",
                doc_ids=[doc.doc_id] if doc else None,
                declared_agent_id="",
            )
            raise
        try:
            self._check_ingest_limits(docs)
        except InvalidInput as exc:
            # Access was granted; the request is refused for its size.
            self.recorder.error(
                exc,
                trace_id,
                principal,
                started,
                action="ingest",
                team_id=docs[0].team_id if docs else "",
                doc_ids=[d.doc_id for d in docs[:1000]],
            )
            raise
        for doc in docs:
            ctx = contexts[doc.team_id]
            self.recorder.decision(
                trace_id,
                principal,
                started,
                action="ingest",
                decision="allow",
                reason="granted",
                http_status=200,
                team_id=doc.team_id,
                resource=_doc_resource(doc),
                doc_ids=[doc.doc_id],
                subject=ctx.user_id if principal.trusts_body else principal.sub,
            )
        chars = sum(len(d.text) for d in docs)
        if self.jobs is not None and (prefer_async or chars > self.settings.ingest.sync_max_chars):
            job = await asyncio.to_thread(self.jobs.submit, docs, _job_subject(principal), trace_id)
            if self.worker is not None:
                self.worker.wake()
            return IngestJobAccepted(
                job_id=job.job_id,
                status_url=f"/ingest/jobs/{job.job_id}",
                documents=job.documents,
                chars=job.chars,
                trace_id=trace_id,
            )
        return _response(await self.pipeline.ingest(docs), trace_id)

    async def _run_job(self, job: IngestJob, docs: list[SourceDocument]) -> dict[str, Any]:
        report = await self.pipeline.ingest(docs)
        return _response(report, job.trace_id).model_dump(mode="json")

    async def job_status(self, job_id: str, principal: Principal) -> IngestJobStatus:
        """The job ``job_id`` as its submitter sees it.

        Raises:
            NotFound: no such job, or it was submitted by someone else (the same answer, so
                a job id of another caller reveals nothing).
        """
        job = None
        if self.jobs is not None and len(job_id) == 32:
            job = await asyncio.to_thread(self.jobs.get, job_id)
        if job is None or job.subject != _job_subject(principal):
            raise NotFound(
                f"job_id: no ingest job {job_id!r} of this caller",
                hint="the job id comes from the 202 answer of POST /ingest/documents",
                field="job_id",
            )
        return IngestJobStatus(
            job_id=job.job_id,
            status=job.status,
            documents=job.documents,
            chars=job.chars,
            attempts=job.attempts,
            created_at=job.created_at.isoformat(),
            updated_at=job.updated_at.isoformat(),
            result=IngestDocumentsResponse.model_validate(job.result) if job.result else None,
            error=job.error or None,
            trace_id=job.trace_id,
        )

    async def ingest_events(
        self, events: list[MappedEvent | InvalidEvent], rc: RequestContext
    ) -> IngestEventsResponse:
        """Apply bus-event envelopes (``POST /ingest/events``): the write rules of
        ``ingest_documents`` per event's ``meta.team_id`` (a delete is checked against the
        stored document's doc type, visibility and project when the registry has it), every
        allowed event audited; then ``batch_ingest.events.apply_events``.

        Raises:
            Forbidden: an event the caller may not write; nothing is applied then.
            InvalidInput: too many events or a document too long.
        """
        trace_id, principal, started = rc.trace_id, rc.principal, rc.started
        valid = [e for e in events if isinstance(e, MappedEvent)]
        checked: list[tuple[int, MappedEvent, SourceDocument]] = []
        for i, ev in enumerate(events):
            if isinstance(ev, MappedEvent):
                checked.append((i, ev, await self._event_document(ev)))
        contexts: dict[str, AccessContext] = {}
        for i, _ev, doc in checked:
            where = f"events.{i}"
            try:
                ctx = contexts.get(doc.team_id)
                if ctx is None:
                    ctx = AccessContext.for_team(
                        principal, doc.team_id, self.policy, field_name=f"{where}.meta.team_id"
                    )
                    contexts[doc.team_id] = ctx
                ctx.check_write(doc, where)
            except Forbidden as exc:
                self.recorder.error(
                    exc,
                    trace_id,
                    principal,
                    started,
                    action="ingest.events",
                    team_id=doc.team_id,
                    resource=_doc_resource(doc),
                    doc_ids=[doc.doc_id],
                    declared_agent_id="",
                )
                raise
        docs = [ev.document for ev in valid if ev.document is not None]
        if len(events) > self.settings.ingest.max_documents:
            raise InvalidInput(
                f"events: at most {self.settings.ingest.max_documents} per request, "
                f"got {len(events)}",
                hint="split the batch into several requests",
                field="events",
            )
        self._check_ingest_limits(docs)
        for _, ev, doc in checked:
            self.recorder.decision(
                trace_id,
                principal,
                started,
                action="ingest.events",
                decision="allow",
                reason="granted",
                http_status=200,
                team_id=doc.team_id,
                resource=f"{_doc_resource(doc)}/{ev.envelope.type}@{ev.revision}",
                doc_ids=[doc.doc_id],
                subject=contexts[doc.team_id].user_id if principal.trusts_body else principal.sub,
            )
        results, degraded = await apply_events(self.pipeline, events)
        counts = count_statuses(results)
        return IngestEventsResponse(
            degraded=bool(degraded or counts["failed"]),
            degraded_reasons=degraded
            + [f"{r.event_id}: {r.error}" for r in results if r.status == "failed"],
            counts=counts,
            events=results,
            took_ms=round((time.perf_counter() - started) * 1000, 1),
            trace_id=trace_id,
        )

    async def sync_source(self, body: IngestSyncRequest, rc: RequestContext) -> IngestSyncResponse:
        """``POST /ingest/sync`` (serve_app/ingest/sync.py)."""
        return await sync_source(
            body, rc, pipeline=self.pipeline, policy=self.policy, recorder=self.recorder
        )

    async def _event_document(self, ev: MappedEvent) -> SourceDocument:
        """The document an event writes; for a delete, the stored one (its real doc type,
        visibility and project), or a public stand-in when the registry does not know it."""
        if ev.document is not None:
            return ev.document
        sources = self.pipeline.sources
        if sources is not None:
            row = await asyncio.to_thread(sources.get, ev.key)
            if row is not None and row.document is not None:
                return row.document
        team_id, doc_type, doc_id = ev.key
        return SourceDocument(team_id=team_id, doc_type=doc_type, doc_id=doc_id, text="-")

    def _check_ingest_limits(self, docs: list[SourceDocument]) -> None:
        limits = self.settings.ingest
        if len(docs) > limits.max_documents:
            raise InvalidInput(
                f"documents: at most {limits.max_documents} per request, got {len(docs)}",
                hint="split the batch into several requests",
                field="documents",
            )
        for i, doc in enumerate(docs):
            if len(doc.text) > limits.max_document_chars:
                raise InvalidInput(
                    f"documents.{i}.text: {len(doc.text)} characters, the limit is "
                    f"{limits.max_document_chars}",
                    field=f"documents.{i}.text",
                )

    # --- health -------------------------------------------------------------------------


def _response(report: IngestReport, trace_id: str) -> IngestDocumentsResponse:
    counts = {
        s: sum(r.status == s for r in report.results) for s in ("indexed", "unchanged", "failed")
    }
    return IngestDocumentsResponse(
        degraded=bool(report.degraded or counts["failed"]),
        degraded_reasons=report.degraded + [f"{r.doc_id}: {r.error}" for r in report.failed],
        documents=[IngestedDocument(**vars(r)) for r in report.results],
        took_ms=report.took_ms,
        trace_id=trace_id,
        **counts,
    )


def _job_subject(principal: Principal) -> str:
    """Who owns a job: the verified subject (with its method: an API key and a token of the
    same name are different callers); every development-mode caller is one subject."""
    return f"{principal.method}:{principal.sub}"


def _failing_document(exc: Forbidden, docs: list[SourceDocument]) -> SourceDocument | None:
    """The document a ``check_ingest`` refusal names (``documents.<i>....``)."""
    parts = (exc.field or "").split(".")
    if len(parts) > 1 and parts[0] == "documents" and parts[1].isdigit():
        i = int(parts[1])
        if i < len(docs):
            return docs[i]
    return None


def _doc_resource(doc: SourceDocument) -> str:
    resource = f"team:{doc.team_id}"
    if doc.project_id:
        resource += f"/project:{doc.project_id}"
    return f"{resource}/{doc.doc_type}:{doc.doc_id}"
