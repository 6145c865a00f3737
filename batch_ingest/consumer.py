"""The bus consumer: NATS JetStream events → the idempotent ingestion pipeline.

    python -m batch_ingest.consumer --url nats://127.0.0.1:4222          # until SIGTERM/SIGINT
    python -m batch_ingest.consumer --batch 32 --max-deliver 5 --backoff 5,15,30,60

What it does:

- Creates (idempotently) the stream ``RAG_EVENTS`` over the team subjects of the ingestion
  types, ``rag.team.<team>.<type>`` (``chat.message.created``, ``doc.upserted``,
  ``file.uploaded``, ``doc.deleted``, and the specification's ``message.created`` and
  ``doc.upsert`` as aliases; a team id that is not one plain subject token is written ``=`` +
  base64url, ``batch_ingest.event_types.team_token``), file storage, 7 days, a 2-minute
  duplicate window (publishers should set ``Nats-Msg-Id`` to the ``event_id``: the server then
  drops a re-published copy), and the stream ``RAG_EVENTS_DLQ`` over ``rag.dlq.>``.
- Connects with its nkey (``nats.nkey_seed_file``, else the local ``var/nats/auth/
  consumer.nk``; ``batch_ingest.bus_auth``) and TLS when configured; producers hold
  credentials bound to their teams' subjects, anonymous connections are refused.
- A durable pull consumer (``rag-ingest``): explicit ack, no delivery limit on the server
  (the consumer decides when to give up, below), redelivery ``ack_wait`` (the first
  ``backoff_s`` step) after an unacked delivery, e.g. a crashed consumer; ``in_progress`` is
  sent while a batch is being indexed so a slow batch is not redelivered under it.
- Fetches up to ``--batch`` messages and applies them with ``batch_ingest.events.apply_events``
  (one embedding call for the batch; per document only a revision newer than the source
  registry's is applied, so redeliveries and reordering change nothing). An event published
  on another team's subject (``meta.team_id`` differs), on a subject without a team (the
  type-only subjects of before: ``nats.legacy_subjects`` reads them during a migration) or as
  another type than its subject's is invalid. Then per message:
  applied / unchanged / stale → ack; invalid envelope → published to ``rag.dlq.<type>`` and
  ``term`` (never redelivered); failed for a lasting cause (the store refuses the document) →
  ``nak`` with the backoff delay of its delivery count, and at the N-th delivery
  (``max_deliver``) published to the dead-letter subject with its error and acked; failed for
  a passing cause (Milvus, Neo4j or the embedder unavailable, a document busy, the registry
  unwritten: ``retryable``) → ``nak`` at most ``retry_max_delay_s`` apart for as long as it is
  younger than ``retry_for_s`` (24 h): an outage is waited out, not dead-lettered. The
  server's consumer redelivers without limit; the consumer decides.
  An upsert whose chunks were written but whose graph write failed counts as failed (the
  registry keeps its old revision, so the redelivery retries the graph).
- Several consumers (and gateway replicas) may run at once: each document is leased in the
  source registry while its events are applied (``SourceStore.claim``), so two writers never
  interleave one document's revisions.
- After a document is searchable: ``rag.team.<team>.document.indexed`` (``{team_id, doc_id,
  doc_type, chunks, revision, event_id, event_ts, status, meta: {team_id, trace_id}}``,
  ``trace_id`` the source event's ``meta.trace_id``), after a delete
  ``rag.team.<team>.document.deleted``: a subscriber's permissions can name its teams.
- Trace ids: each event is logged (one line: id, type, document, status) and settled under
  its own ``meta.trace_id``; the batch's shared work under its first one, its lines listing
  all (``handle``). ``--log-format json`` writes one JSON object per line with ``trace_id``.
- SIGTERM/SIGINT: stops fetching, finishes and acks the batch in flight, drains, closes.

Why in-process and not ``POST /ingest/events`` on the gateway: the consumer is a platform
service behind the bus, not an agent; who may publish an event for a tenant is decided by the
bus's own accounts and subject permissions on the team subjects, and the tenant of an event is
its subject's team, which its ``meta.team_id`` must repeat (a payload naming another team is
refused). Running the pipeline here (the
real ``MilvusStore``, ``LocalEmbedder``, ``Neo4jGraph`` and ``SourceStore``, configured by the
same environment as the gateway: ``BatchSettings``, with ``NATS__URL`` etc. for the bus) keeps
ingestion off the Serve request path, needs no service credential, and gives the batch one
embedding call without a second HTTP batching layer; it is the same ``apply_events`` code the
HTTP endpoint runs (which adds the per-caller write checks for producers outside the bus).
Milvus Lite serialises writers in its server process, so the consumer and the gateway may write
at once. ``--subject-prefix`` isolates environments (and tests) on one server: it prefixes
every subject, including the dead-letter and notification subjects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from batch_ingest.consumer_metrics import ConsumerMetrics
from batch_ingest.event_types import event_subject, parse_subject
from batch_ingest.events import (
    EventResult,
    InvalidEvent,
    MappedEvent,
    apply_events,
    parse_event,
)
from batch_ingest.events.bus_audit import BusAudit
from batch_ingest.events.outage import OutageGate, backend_probes, is_outage
from batch_ingest.events.slow_lane import SlowLane
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.settings import AuditSettings, BatchSettings, ConsumerSettings
from deployments.errors import BackendUnavailable
from deployments.tracing import LOG_FORMATS, configure_logging, trace_context

logger = logging.getLogger("batch_ingest.consumer")


@dataclass
class ConsumerStats:
    batches: int = 0
    messages: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    acked: int = 0
    naked: int = 0
    dead_lettered: int = 0

    def count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


async def ensure_stream(js: Any, cfg: ConsumerSettings) -> None:
    """Create or extend the event stream and the dead-letter stream (idempotent)."""
    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    async def one(name: str, subjects: list[str], exact: bool = False, **extra: Any) -> None:
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            await js.add_stream(
                StreamConfig(name=name, subjects=subjects, storage=StorageType.FILE, **extra)
            )
            logger.info("created stream %s over %s", name, ", ".join(subjects))
            return
        have = list(info.config.subjects or [])
        missing = [s for s in subjects if s not in have]
        extra_subjects = [s for s in have if s not in subjects] if exact else []
        if missing or extra_subjects:
            info.config.subjects = [s for s in have if s not in extra_subjects] + missing
            await js.update_stream(info.config)
            logger.info(
                "stream %s: takes %s%s",
                name,
                ", ".join(info.config.subjects),
                f" (no longer {', '.join(extra_subjects)})" if extra_subjects else "",
            )

    # Exactly the team subjects: a type-only subject of before would let anyone who may
    # publish there write into any team.
    await one(
        cfg.stream,
        cfg.subjects,
        exact=True,
        max_age=cfg.max_age_s,
        duplicate_window=cfg.duplicate_window_s,
    )
    await one(cfg.dlq_stream, [cfg.dlq_subject(">")])


async def ensure_consumer(js: Any, cfg: ConsumerSettings) -> None:
    """The durable pull consumer (created once; an existing one is kept as it is, but for a
    delivery limit of its own, which is lifted: the consumer decides when to give up)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    try:
        info = await js.consumer_info(cfg.stream, cfg.durable)
    except NotFoundError:
        info = None
    if info is not None:
        if info.config.max_deliver not in (None, -1, 0):
            # Past its limit the server would stop redelivering an event still retried.
            limit = info.config.max_deliver
            info.config.max_deliver = -1
            info.config.backoff = None  # the server allows a backoff list only with a limit
            await js.add_consumer(cfg.stream, info.config)
            logger.info("durable consumer %s: delivery limit %d lifted", cfg.durable, limit)
        return
    ack_wait = cfg.backoff_s[0] if cfg.backoff_s else 30.0
    await js.add_consumer(
        cfg.stream,
        ConsumerConfig(
            durable_name=cfg.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            # Unlimited on the server: the consumer decides (max_deliver for lasting causes,
            # retry_for_s for passing ones) and dead-letters what it gives up on.
            max_deliver=-1,
            ack_wait=ack_wait,
            max_ack_pending=cfg.max_ack_pending,
        ),
    )
    logger.info(
        "created durable consumer %s on %s (dead-letters after %d deliveries of a lasting "
        "failure, retries a passing one for %gs; ack wait %gs)",
        cfg.durable,
        cfg.stream,
        cfg.max_deliver,
        cfg.retry_for_s,
        ack_wait,
    )


class EventConsumer:
    """Pulls batches from the durable consumer and applies them through ``pipeline``."""

    def __init__(
        self,
        nc: Any,
        pipeline: IngestPipeline,
        cfg: ConsumerSettings,
        audit: BusAudit | None = None,
    ) -> None:
        self.nc = nc
        # The audit record of every event, written before it is applied (None: not audited,
        # for tests over fakes; ``serve`` always audits unless ``audit.enabled`` is off).
        self.audit = audit
        self.js = nc.jetstream()
        self.pipeline = pipeline
        self.cfg = cfg
        self.stats = ConsumerStats()
        self._sub: Any = None
        # Prometheus metrics when served (nats.metrics_port); refreshed from the server.
        self.metrics: ConsumerMetrics | None = None
        self._refreshed = 0.0
        # Events over nats.large_event_bytes, applied beside the fetch loop.
        self.slow = SlowLane(self.handle, period_s=max(min(cfg.backoff_s or (30.0,)) / 2, 0.5))
        # A batch that failed only for an outage is held and applied when the backends are
        # back (batch_ingest/events/outage.py), while run() runs (``_stop`` set).
        self._stop: asyncio.Event | None = None
        self.gate = OutageGate(
            backend_probes(self),
            self._keep_alive,
            _age_s,
            retry_for_s=cfg.retry_for_s,
            max_delay_s=cfg.retry_max_delay_s,
        )

    async def setup(self) -> None:
        await ensure_stream(self.js, self.cfg)
        await ensure_consumer(self.js, self.cfg)
        self._sub = await self.js.pull_subscribe_bind(
            durable=self.cfg.durable, stream=self.cfg.stream
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and apply until ``stop`` is set; the batch in flight (and the large event
        being applied in the slow lane) is finished first."""
        self._stop = stop
        try:
            await self._fetch_and_apply(stop)
        finally:
            await self.slow.close()

    async def _fetch_and_apply(self, stop: asyncio.Event) -> None:
        import nats.errors

        if self._sub is None:
            await self.setup()
        while not stop.is_set():
            _raise_if_cancelled()
            if self.metrics is not None and time.monotonic() - self._refreshed >= 5.0:
                self._refreshed = time.monotonic()
                cfg = self.cfg
                await self.metrics.refresh(self.js, cfg.stream, cfg.durable, cfg.dlq_stream)
            # Wait for one message, then take what else is there: a single fetch of B waits
            # for B messages or the whole timeout (nats-server 2.9), which would add up to
            # fetch_timeout_s of latency to every event of a trickle.
            timeouts = (nats.errors.TimeoutError, asyncio.TimeoutError)
            try:
                msgs = await self._sub.fetch(1, timeout=self.cfg.fetch_timeout_s)
            except timeouts:
                continue
            except Exception as exc:  # connection trouble: the client reconnects
                logger.warning("fetch failed: %s: %s", type(exc).__name__, exc)
                await asyncio.sleep(1.0)
                continue
            if self.cfg.batch > 1:
                try:
                    msgs += await self._sub.fetch(self.cfg.batch - 1, timeout=0.1)
                except timeouts:
                    pass
                except Exception as exc:  # the first message is still handled
                    logger.warning("fetch failed: %s: %s", type(exc).__name__, exc)
            # nats-py waits with asyncio.wait_for, which on Python 3.11 drops a cancellation
            # that lands as a message arrives; the task still counts it, so honour it here
            # (the fetched messages are not acked and are redelivered).
            _raise_if_cancelled()
            small = [m for m in msgs if len(m.data) <= self.cfg.large_event_bytes]
            for msg in msgs:
                if len(msg.data) > self.cfg.large_event_bytes:
                    await self.slow.put(msg)
            if small:
                await self.handle(small)

    async def close(self) -> None:
        """Unsubscribe (the durable consumer stays on the server), drain and close."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    async def handle(self, msgs: list[Any]) -> list[EventResult]:
        """Apply a batch, settle each message, announce what became searchable or deleted.

        Trace ids (``meta.trace_id``): the per-event work (settling, dead-lettering, the
        event's log line, its notification) runs under the event's own trace id. The shared
        work (one ``apply_events`` call: embedding, Milvus, Neo4j, the registry for all events
        at once) runs under the batch's first trace id, and the batch's log lines list all of
        them (``traces …``), so a search for any one finds them.
        """
        started = time.perf_counter()
        parsed = [self._parse(m) for m in msgs]
        traces = list(dict.fromkeys(ev.trace_id for ev in parsed if ev.trace_id))
        with trace_context(traces[0] if traces else ""):
            rounds = 0
            while True:
                results, degraded = await self._apply(msgs, parsed, traces)
                stop = self._stop
                if stop is None or not is_outage(results):
                    break
                if not await self.gate.hold(msgs, rounds, stop):
                    break
                rounds += 1
            return await self._finish(msgs, parsed, traces, results, degraded, started)

    async def _apply(
        self, msgs: list[Any], parsed: list[MappedEvent | InvalidEvent], traces: list[str]
    ) -> tuple[list[EventResult], list[str]]:
        """Audit, then apply the batch; a batch-wide failure as ``failed`` results."""
        beat = asyncio.create_task(self._keep_alive(msgs))
        try:
            try:
                if self.audit is not None:
                    await self._audit(msgs, parsed)
            except BackendUnavailable as exc:  # no record, no write: the batch waits
                logger.warning("batch of %d waits%s: %s", len(msgs), _listed(traces), exc)
                results = [_unaudited(ev, exc.message) for ev in parsed]
                degraded: list[str] = []
            else:
                try:
                    results, degraded = await apply_events(self.pipeline, parsed)
                except Exception as exc:  # Milvus/embedder down before anything was written
                    logger.warning("batch of %d failed%s: %s", len(msgs), _listed(traces), exc)
                    error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                    passing = isinstance(exc, BackendUnavailable | ConnectionError | TimeoutError)
                    results, degraded = [_failed(ev, error, passing) for ev in parsed], []
        finally:
            beat.cancel()
        return results, degraded

    async def _finish(
        self,
        msgs: list[Any],
        parsed: list[MappedEvent | InvalidEvent],
        traces: list[str],
        results: list[EventResult],
        degraded: list[str],
        started: float,
    ) -> list[EventResult]:
        """Settle each message, announce what became searchable or deleted, count."""
        for reason in degraded:
            logger.warning("degraded%s: %s", _listed(traces), reason)
        notes: list[tuple[str, dict[str, Any]]] = []
        for msg, ev, result in zip(msgs, parsed, results, strict=True):
            with trace_context(ev.trace_id):
                self.stats.count(result.status)
                logger.info("event %s", _describe(result))
                await self._settle(msg, ev, result)
            # Searchable: indexed, or indexed with the graph write still to retry (that
            # redelivery is then "unchanged" and announces nothing again).
            if result.searchable:
                notes.append(
                    (self.cfg.notice_subject(result.team_id, "indexed"), _note(result, ev))
                )
            elif result.status == "deleted":
                notes.append(
                    (self.cfg.notice_subject(result.team_id, "deleted"), _note(result, ev))
                )
        await self.nc.flush()
        for subject, note in notes:
            await self.nc.publish(subject, json.dumps(note).encode())
        self.stats.batches += 1
        self.stats.messages += len(msgs)
        if self.metrics is not None:
            self.metrics.batch([r.status for r in results], time.perf_counter() - started)
        logger.info(
            "batch of %d in %.0f ms%s: %s",
            len(msgs),
            (time.perf_counter() - started) * 1000,
            _listed(traces),
            ", ".join(f"{k} {v}" for k, v in sorted(self.stats.statuses.items())),
        )
        return results

    async def _audit(self, msgs: list[Any], parsed: list[MappedEvent | InvalidEvent]) -> None:
        """Write the batch's audit records; an audit database that fails them stops the batch
        before anything is applied (its events wait like in any outage)."""
        assert self.audit is not None
        try:
            await self.audit.write(msgs, parsed)
        except Exception as exc:
            raise BackendUnavailable("audit log", f"{type(exc).__name__}: {exc}") from exc

    def _parse(self, msg: Any) -> MappedEvent | InvalidEvent:
        """The event, or why it is refused: published on a subject without a team (unless
        ``legacy_subjects``), on another team's subject, or as another type than its
        subject's."""
        ev = parse_event(msg.data)
        team, expected, _producer = parse_subject(msg.subject, self.cfg.subject_prefix)
        if not isinstance(ev, MappedEvent):
            return ev
        problem = None
        if team is None and not self.cfg.legacy_subjects:
            problem = (
                "subject",
                f"published on {msg.subject!r}, a subject without a team; publish on "
                f"{event_subject(ev.key[0], ev.envelope.type, self.cfg.subject_prefix)!r}",
            )
        elif team is not None and team != ev.key[0]:
            problem = (
                "meta.team_id",
                f"an event of team {ev.key[0]!r} published on team {team!r}'s subject "
                f"{msg.subject!r}",
            )
        elif ev.envelope.type != expected:
            problem = ("type", f"{ev.envelope.type!r} published on subject {msg.subject!r}")
        if problem is None:
            return ev
        return InvalidEvent(
            ev.event_id,
            ev.envelope.type,
            [{"field": problem[0], "problem": problem[1]}],
            ev.trace_id,
        )

    async def _keep_alive(self, msgs: list[Any]) -> None:
        """Tell the server the batch is being worked on (resets each ack timer)."""
        period = max(min(self.cfg.backoff_s or (30.0,)) / 2, 0.5)
        while True:
            await asyncio.sleep(period)
            for m in msgs:
                with contextlib.suppress(Exception):
                    await m.in_progress()

    async def _settle(self, msg: Any, ev: Any, result: EventResult) -> None:
        delivered = _delivered(msg)
        if result.status == "invalid":
            if await self._dead_letter(msg, result, delivered):
                await msg.term()
            return
        if result.status == "failed":
            if result.retryable and _age_s(msg) < self.cfg.retry_for_s:
                # A passing cause (an outage): not poison, wait it out.
                delay = min(self.cfg.backoff_for(delivered), self.cfg.retry_max_delay_s)
                await msg.nak(delay=delay)
                self.stats.naked += 1
                return
            if result.retryable or delivered >= self.cfg.max_deliver:
                if await self._dead_letter(msg, result, delivered):
                    await msg.ack()
                    self.stats.acked += 1
                return
            await msg.nak(delay=self.cfg.backoff_for(delivered))
            self.stats.naked += 1
            return
        await msg.ack()
        self.stats.acked += 1

    async def _dead_letter(self, msg: Any, result: EventResult, delivered: int) -> bool:
        """Publish the message with its error to ``rag.dlq.<type>``; False (and a nak) when
        the dead-letter stream did not take it, so nothing is lost."""
        body = {
            "subject": msg.subject,
            "event_id": result.event_id,
            "type": result.type,
            "status": result.status,
            "error": result.error,
            "fields": result.fields,
            "num_delivered": delivered,
            "stream_seq": _stream_seq(msg),
            "failed_at": time.time(),
            "event": msg.data.decode("utf-8", errors="replace"),
        }
        try:
            await self.js.publish(
                self.cfg.dlq_subject(result.type or "invalid"), json.dumps(body).encode()
            )
        except Exception as exc:
            logger.error("dead-letter publish failed (%s); message redelivered later", exc)
            await msg.nak(delay=self.cfg.backoff_for(delivered))
            return False
        self.stats.dead_lettered += 1
        logger.warning(
            "dead-lettered %s (%s) after %d deliveries: %s",
            result.event_id or "?",
            result.status,
            delivered,
            result.error,
        )
        return True


def _raise_if_cancelled() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("cancelled while fetching")


def _delivered(msg: Any) -> int:
    try:
        return int(msg.metadata.num_delivered)
    except Exception:
        return 1


def _age_s(msg: Any) -> float:
    """Seconds since the event entered the stream (0 when the message does not say)."""
    try:
        return max(0.0, time.time() - msg.metadata.timestamp.timestamp())
    except Exception:
        return 0.0


def _stream_seq(msg: Any) -> int | None:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:
        return None


def _failed(ev: MappedEvent | InvalidEvent, error: str, retryable: bool) -> EventResult:
    from batch_ingest.events import invalid_result

    if isinstance(ev, InvalidEvent):
        return invalid_result(ev)
    return EventResult(
        event_id=ev.event_id,
        type=ev.envelope.type,
        team_id=ev.key[0],
        doc_type=ev.key[1],
        doc_id=ev.key[2],
        revision=ev.revision,
        status="failed",
        error=error,
        retryable=retryable,
        trace_id=ev.trace_id,
    )


def _unaudited(ev: MappedEvent | InvalidEvent, error: str) -> EventResult:
    """An event whose audit record could not be written: not applied, nor dead-lettered if
    invalid; retried until the audit log takes its record."""
    if isinstance(ev, MappedEvent):
        return _failed(ev, error, True)
    return EventResult(
        event_id=ev.event_id,
        type=ev.type,
        status="failed",
        error=error,
        retryable=True,
        trace_id=ev.trace_id,
    )


def _note(result: EventResult, ev: Any) -> dict[str, Any]:
    """The notification body; ``meta`` as in the bus envelope, with the source event's
    ``trace_id``."""
    return {
        "team_id": result.team_id,
        "doc_id": result.doc_id,
        "doc_type": result.doc_type,
        "chunks": result.chunks,
        "revision": result.revision,
        "event_id": result.event_id,
        "event_ts": ev.envelope.ts if isinstance(ev, MappedEvent) else None,
        "status": result.status,
        "meta": {"team_id": result.team_id, "trace_id": result.trace_id},
    }


def _listed(traces: list[str]) -> str:
    """`` (traces a, b)`` for a batch's log lines; ``""`` when its events carry none."""
    return f" (traces {', '.join(traces)})" if traces else ""


def _describe(result: EventResult) -> str:
    """One event's outcome, for its log line: id, type, document@revision, status, why."""
    doc = "/".join(p for p in (result.team_id, result.doc_type, result.doc_id) if p)
    where = f" {doc}@{result.revision}" if doc else ""
    text = f"{result.event_id or '?'} ({result.type or '?'}{where}): {result.status}"
    if result.chunks:
        text += f", {result.chunks} chunks"
    return f"{text}: {result.error}" if result.error else text


def build_pipeline(settings: Any = None, usage_source: str = "bus") -> IngestPipeline:
    """The gateway's pipeline in this process: LocalEmbedder, Milvus, Neo4j, SourceStore,
    all configured by ``BatchSettings`` (the same environment variables as the gateway);
    its embeddings are counted as ``usage_source`` (batch_ingest/usage.py)."""
    from batch_ingest import pipeline
    from batch_ingest.source_store import SourceStore
    from deployments.graph_store.store import Neo4jGraph
    from deployments.models.embedder_models import LocalModels
    from deployments.models.embedding import embedding_dim
    from deployments.protocols import Backends
    from deployments.vector_store.deployment import RetrieverDeployment

    settings = settings or BatchSettings()
    # During a change of model (``embedder_next``) both models, picked per team.
    embedder = LocalModels(*settings.embedders)
    embedder.models.start()
    backends = Backends(
        embedder=embedder,
        store=RetrieverDeployment(
            settings.milvus,
            embedding_dim(settings.embedder),
            settings.embedder.lexical,
            models={e.embed_model_tag: embedding_dim(e) for e in settings.embedders},
        ),
        graph=Neo4jGraph(settings.neo4j),
    )
    return pipeline.build_pipeline(
        settings, backends, sources=SourceStore(settings.state.url), usage_source=usage_source
    )


def consumer_connect_options(cfg: ConsumerSettings) -> dict[str, Any]:
    """The consumer's credential and TLS for ``nats.connect`` (``nats.nkey_seed_file``, else
    the local seed scripts/services.py made, else none)."""
    from batch_ingest.bus_auth import BusAuth, connect_options

    seed = cfg.nkey_seed_file
    if not seed and (local := BusAuth().seed_file("consumer")).exists():
        seed = str(local)
    tls = None
    if cfg.tls_ca_file or cfg.tls_cert_file:
        import ssl

        tls = ssl.create_default_context(cafile=cfg.tls_ca_file or None)
        if cfg.tls_cert_file:
            tls.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file or None)
    return connect_options(seed or None, tls=tls)


async def serve(
    cfg: ConsumerSettings,
    pipeline: IngestPipeline | None = None,
    audit_settings: AuditSettings | None = None,
) -> ConsumerStats:
    """Consume until SIGTERM/SIGINT; every event audited in ``audit_settings``' database
    (default: ``BatchSettings().audit``, the gateway's) unless that is disabled."""
    import nats

    pipeline = pipeline or build_pipeline()
    audit_settings = audit_settings or BatchSettings().audit
    options = consumer_connect_options(cfg)
    nc = await nats.connect(
        cfg.url, name=f"rag-consumer-{cfg.durable}", max_reconnect_attempts=-1, **options
    )
    audit = None
    if audit_settings.enabled:
        audit = BusAudit(
            audit_settings,
            authenticated=bool(options.get("nkeys_seed") or options.get("nkeys_seed_str")),
            subject_prefix=cfg.subject_prefix,
        )
    consumer = EventConsumer(nc, pipeline, cfg, audit)
    if cfg.metrics_port:
        consumer.metrics = ConsumerMetrics()
        consumer.metrics.serve(cfg.metrics_port, cfg.metrics_host)
    await consumer.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logger.info("consuming %s as %s from %s", cfg.stream, cfg.durable, cfg.url)
    try:
        await consumer.run(stop)
    finally:
        await consumer.close()
        graph = pipeline.graph
        if graph is not None and hasattr(graph, "close"):
            with contextlib.suppress(Exception):
                await graph.close()
        if audit is not None:
            audit.close()
    logger.info("stopped: %s", consumer.stats)
    return consumer.stats


def main(argv: list[str] | None = None) -> int:
    settings = BatchSettings()
    d = settings.nats  # NATS__URL, NATS__STREAM, ...; the flags override them
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=d.url)
    p.add_argument("--stream", default=d.stream)
    p.add_argument("--durable", default=d.durable)
    p.add_argument("--subject-prefix", default=d.subject_prefix)
    p.add_argument("--batch", type=int, default=d.batch, help="messages per fetch (one embed)")
    p.add_argument("--max-deliver", type=int, default=d.max_deliver)
    p.add_argument(
        "--backoff",
        default=",".join(f"{s:g}" for s in d.backoff_s),
        help="seconds before each redelivery, comma-separated",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=d.metrics_port,
        help="serve Prometheus /metrics on this port (127.0.0.1; 0: off)",
    )
    p.add_argument(
        "--nkey-seed-file",
        default=d.nkey_seed_file,
        help="the consumer's nkey seed (default: var/nats/auth/consumer.nk when it exists)",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="json: one JSON object per log line, with the event's trace_id",
    )
    args = p.parse_args(argv)
    configure_logging(args.log_format, text_format="%(asctime)s %(name)s %(message)s")
    cfg = ConsumerSettings.model_validate(
        {
            **d.model_dump(),
            "url": args.url,
            "stream": args.stream,
            "durable": args.durable,
            "subject_prefix": args.subject_prefix,
            "nkey_seed_file": args.nkey_seed_file,
            "metrics_port": args.metrics_port,
            "batch": args.batch,
            "max_deliver": args.max_deliver,
            "backoff_s": tuple(float(x) for x in args.backoff.split(",") if x.strip()),
        }
    )
    asyncio.run(serve(cfg, build_pipeline(settings), settings.audit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
