"""The typed app builder that ``serve_config.yaml`` imports, and the ingress deployment.

    serve run serve_app.app:build_app          # defaults
    serve deploy serve_config.yaml              # ops

``build_app(args)`` validates its args, builds ``GatewaySettings`` (environment first, then
``args.settings`` on top) and composes Embedder, Reranker (when enabled), Retriever, Graph and
the FastAPI Ingress, which receives their handles.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, Field
from ray import serve
from ray.serve import Application

from batch_ingest.chunking import Chunker, embedder_token_counter
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.source_store import SourceStore
from deployments.config import GatewaySettings
from deployments.embedder import EmbedderDeployment, embedding_dim
from deployments.graph import GraphDeployment
from deployments.reranker import RerankerDeployment
from deployments.retriever import RetrieverDeployment
from serve_app.handles import HandleProxy
from serve_app.http import create_app
from serve_app.policy import Policy
from serve_app.service import GatewayService

logger = logging.getLogger(__name__)


class AppArgs(BaseModel):
    """Arguments of ``build_app`` (the ``args:`` block of serve_config.yaml)."""

    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="GatewaySettings overrides, e.g. {milvus: {uri: ...}}; env vars apply first",
    )
    graph_enabled: bool = True

    def gateway_settings(self) -> GatewaySettings:
        """Environment first, ``settings`` on top, validated once as a whole."""
        # Init arguments take precedence over env vars in pydantic-settings and nested
        # sections are merged field by field, so args can complete what env alone lacks.
        return GatewaySettings(**self.settings)


class Ingress:
    """FastAPI ingress: builds ``GatewayService`` over the handles of the other deployments."""

    def __init__(
        self,
        settings: GatewaySettings,
        embedder: Any,
        retriever: Any,
        graph: Any = None,
        reranker: Any = None,
    ) -> None:
        logging.basicConfig(level=logging.INFO)
        self.settings = settings
        embedder_proxy = HandleProxy(_direct(embedder), "embedder")
        store = HandleProxy(_direct(retriever), "milvus")
        graph_proxy = HandleProxy(_direct(graph), "neo4j") if graph is not None else None
        count_tokens = embedder_token_counter(settings.embedder)
        chunker = Chunker(
            count_tokens,
            settings.chunking.max_tokens,
            settings.chunking.overlap_tokens,
        )
        pipeline = IngestPipeline(
            embedder=embedder_proxy,
            store=store,
            graph=graph_proxy,
            chunker=chunker,
            embed_model=settings.embedder.embed_model_tag,
            sources=SourceStore(settings.state.url),
        )
        self.service = GatewayService(
            settings=settings,
            embedder=embedder_proxy,
            store=store,
            graph=graph_proxy,
            reranker=HandleProxy(_direct(reranker), "reranker") if reranker is not None else None,
            pipeline=pipeline,
            count_tokens=count_tokens,
        )

    def __serve_build_asgi_app__(self):
        return create_app(self.service)

    def __del__(self) -> None:
        # Serve calls __del__ on a graceful replica shutdown: write the queued audit records.
        service = getattr(self, "service", None)
        if service is not None:
            service.audit.close()


def _direct(handle: Any) -> Any:
    """The handle sending its calls over the replicas' own gRPC servers instead of through
    Ray object references: arguments and results are small, and on 2 cores this cut a
    handle call by ~3 ms (bench/README.md, "Where a search's time goes")."""
    return handle.options(_by_reference=False)


def build_app(args: AppArgs) -> Application:
    """Compose the gateway.

    Raises:
        pydantic.ValidationError: bad args or settings.
        ValueError: the policy file is missing or invalid.
    """
    if isinstance(args, dict):  # `serve run` passes a plain dict on some paths
        args = AppArgs.model_validate(args)
    settings = args.gateway_settings()
    # A broken policy file fails the deploy here, not in every Ingress replica.
    Policy.load(settings.auth.policy_file)
    dim = embedding_dim(settings.embedder)
    emb = settings.embedder
    embedder = serve.deployment(
        EmbedderDeployment,
        name="Embedder",
        # Batches fill only when enough requests may be in flight at once.
        max_ongoing_requests=max(256, emb.max_batch_size * 4),
        ray_actor_options={"num_cpus": 1},
        user_config={
            "max_batch_size": emb.max_batch_size,
            "batch_wait_timeout_s": emb.batch_wait_timeout_s,
            "query_batch_wait_timeout_s": emb.query_batch_wait_timeout_s,
        },
    ).bind(emb)
    retriever = serve.deployment(
        RetrieverDeployment,
        name="Retriever",
        max_ongoing_requests=64,
        ray_actor_options={"num_cpus": 0.1},
    ).bind(settings.milvus, dim, settings.search.rrf_k)
    graph = None
    if args.graph_enabled:
        graph = serve.deployment(
            GraphDeployment,
            name="Graph",
            max_ongoing_requests=64,
            ray_actor_options={"num_cpus": 0.1},
        ).bind(settings.neo4j)
    reranker = None
    if settings.reranker.enabled:
        rr = settings.reranker
        reranker = serve.deployment(
            RerankerDeployment,
            name="Reranker",
            max_ongoing_requests=max(64, rr.max_batch_size * 4),
            ray_actor_options={"num_cpus": 0.5},
            user_config={
                "max_batch_size": rr.max_batch_size,
                "batch_wait_timeout_s": rr.batch_wait_timeout_s,
            },
        ).bind(rr)
    ingress = serve.deployment(
        serve.ingress()(Ingress),
        name="Ingress",
        max_ongoing_requests=128,
        ray_actor_options={"num_cpus": 0.1},
    )
    return ingress.bind(settings, embedder, retriever, graph, reranker)
