"""The one composition root: the gateway's services over a set of backends.

The Serve ingress builds them over deployment handles, the tests over fakes, the leak
probes over a real Neo4j; every one gets the same wiring from the same settings."""

from __future__ import annotations

from batch_ingest.chunking import TokenCounter, embedder_token_counter
from batch_ingest.pipeline import build_pipeline
from batch_ingest.source_store import SourceStore
from deployments.protocols import Backends
from serve_app.access.policy import Policy
from serve_app.audit.log import AuditLog
from serve_app.service import GatewayService
from serve_app.settings import GatewaySettings


def build_service(
    settings: GatewaySettings,
    backends: Backends,
    *,
    count_tokens: TokenCounter | None = None,
    sources: SourceStore | None = None,
    policy: Policy | None = None,
    audit: AuditLog | None = None,
) -> GatewayService:
    """The gateway over ``backends``. ``count_tokens`` (chunking and the context-token
    budget) defaults to the embedder's tokenizer; ``policy`` to ``auth.policy_file``;
    ``audit`` to the log ``settings.audit`` configures; ``sources`` is the source-document
    registry (``None`` keeps none)."""
    count = count_tokens or embedder_token_counter(settings.embedder)
    return GatewayService(
        settings=settings,
        embedder=backends.embedder,
        store=backends.store,
        graph=backends.graph,
        reranker=backends.reranker,
        pipeline=build_pipeline(settings, backends, count_tokens=count, sources=sources),
        count_tokens=count,
        policy=policy,
        audit=audit,
    )
