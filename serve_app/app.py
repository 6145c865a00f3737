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

from fastapi import FastAPI
from pydantic import BaseModel, Field
from ray import serve
from ray.serve import Application

from batch_ingest.source_store import SourceStore
from deployments.config import EmbedderSettings
from deployments.graph_store.deployment import GraphDeployment
from deployments.graph_store.deployment import deployment_options as graph_options
from deployments.models.embedder import EmbedderDeployment
from deployments.models.embedder import deployment_options as embedder_options
from deployments.models.embedding import InlineQueryEmbedder, SplitEmbedder, embedding_dim
from deployments.models.reranker import RerankerDeployment
from deployments.models.reranker import deployment_options as reranker_options
from deployments.protocols import Backends
from deployments.vector_store.deployment import RetrieverDeployment, build_store
from deployments.vector_store.deployment import deployment_options as retriever_options
from deployments.vector_store.memindex.front import MemoryFront, hot_index
from serve_app.access.policy import Policy
from serve_app.asgi import create_app
from serve_app.composition import build_services
from serve_app.handles import HandleProxy, MemoryFirstStore, StoreProxy
from serve_app.settings import GatewaySettings
from serve_app.timing import InFlight

logger = logging.getLogger(__name__)
# The ingress's Serve options (the other deployments own theirs: deployment_options()).
INGRESS_OPTIONS: dict[str, Any] = {
    "name": "Ingress",
    "max_ongoing_requests": 128,
    "ray_actor_options": {"num_cpus": 0.1},
}


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
    """FastAPI ingress: builds the gateway's ``Services`` over the handles of the other
    deployments."""

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
        self.in_flight = InFlight()
        remote_embedder = HandleProxy(_direct(embedder), "embedder")
        store: Any = StoreProxy(_direct(retriever), "milvus")
        if settings.memory_index_in_ingress:
            self.local_store = store = _memory_first(settings, store, self.in_flight)
        backends = Backends(
            embedder=_query_embedder(settings, remote_embedder, self.in_flight),
            store=store,
            graph=HandleProxy(_direct(graph), "neo4j") if graph is not None else None,
            reranker=HandleProxy(_direct(reranker), "reranker") if reranker is not None else None,
        )
        self.services = build_services(settings, backends, sources=SourceStore(settings.state.url))

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self.services, in_flight=self.in_flight)

    def __del__(self) -> None:
        # Serve calls __del__ on a graceful replica shutdown: write the queued audit records.
        services = getattr(self, "services", None)
        if services is not None:
            services.recorder.log.close()
        local_store = getattr(self, "local_store", None)
        if local_store is not None:
            local_store.close()


def _served_models(settings: GatewaySettings) -> dict[str, int]:
    """``model tag → vector size`` of the models served, the primary first (during a change
    of model both are; every collection notes its own)."""
    return {e.embed_model_tag: embedding_dim(e) for e in settings.embedders}


def _memory_first(
    settings: GatewaySettings, remote: StoreProxy, in_flight: InFlight
) -> MemoryFirstStore:
    """The in-memory index in this replica, over its own connection to Milvus, in front of
    the Retriever's handle (``milvus.memory_index.serve_from``); a dense scan uses a second
    thread only while this replica serves one request."""
    embedder: EmbedderSettings = settings.embedder
    store = build_store(
        settings.milvus, embedding_dim(embedder), embedder.lexical, _served_models(settings)
    )
    hot = hot_index(settings.milvus, store.versions, busy=in_flight.busy)
    return MemoryFirstStore(remote, MemoryFront(hot))


def _query_embedder(settings: GatewaySettings, remote: Any, in_flight: InFlight) -> Any:
    """The Embedder handle, or, when ``embedder.query_location`` resolves to the ingress,
    the same model loaded in this replica for search queries (a query then pays no hop: ~7
    ms of a ~50 ms search on 2 vCPUs, bench/README.md) with passages, and a query arriving
    while the ingress serves other requests too, sent to the Embedder deployment."""
    if not settings.embedder.queries_in_ingress:
        return remote
    local = InlineQueryEmbedder(settings.embedder, busy=in_flight.busy)
    local.start_loading()
    slots = settings.embedder.ingress_query_slots
    spill = settings.embedder.spills_queries_when_busy
    return SplitEmbedder(
        local,
        remote,
        local_slots=slots,
        busy=in_flight.busy,
        spill_when_busy=spill,
        coalesce_spilled=settings.embedder.coalesces_spilled_queries,
    )


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
    models = _served_models(settings)
    embedder = _deployment(EmbedderDeployment, embedder_options(settings.embedder))
    retriever = _deployment(RetrieverDeployment, retriever_options(settings.milvus))
    graph = reranker = None
    if args.graph_enabled:
        graph = _deployment(GraphDeployment, graph_options(settings.neo4j))
    if settings.reranker.enabled:
        reranker = _deployment(RerankerDeployment, reranker_options(settings.reranker))
    ingress = _deployment(serve.ingress()(Ingress), INGRESS_OPTIONS)
    return ingress.bind(
        settings,
        embedder.bind(settings.embedder, settings.embedder_next),
        retriever.bind(
            settings.milvus,
            dim,
            settings.embedder.lexical,
            models=models,
            memory_index=not settings.memory_index_in_ingress,
        ),
        graph.bind(settings.neo4j) if graph is not None else None,
        reranker.bind(settings.reranker) if reranker is not None else None,
    )


def _deployment(cls: type, options: dict[str, Any]) -> Any:
    """``cls`` as a Serve deployment with the options its shell owns (serve_config.yaml's
    ``deployments`` entries override them at deploy time)."""
    logger.info("deployment %s: %s", options["name"], options)
    return serve.deployment(cls, **options)
