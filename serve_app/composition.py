"""The one composition root: every object of the gateway, built over a set of backends.

The Serve ingress builds them over deployment handles, the tests over fakes, the leak
probes over a real Neo4j; every one gets the same wiring from the same settings. The ASGI
app (serve_app/asgi.py) puts the result on ``app.state.services``, and each feature's
routes read their own service from it through a dependency of that feature."""

from __future__ import annotations

from dataclasses import dataclass

from batch_ingest.chunking import TokenCounter, embedder_token_counter
from batch_ingest.jobs import IngestJobs
from batch_ingest.pipeline import IngestPipeline, build_pipeline
from batch_ingest.reindex.launcher import ReindexJobs
from batch_ingest.source_store import SourceStore
from deployments.protocols import Backends
from serve_app.access.policy import Policy
from serve_app.audit.log import AuditLog
from serve_app.audit.recorder import AuditRecorder
from serve_app.auth import Authenticator
from serve_app.enrich.service import EnrichService
from serve_app.graph.service import GraphTools
from serve_app.http.rate_limits import RateLimiter
from serve_app.http.shared import Shared
from serve_app.ingest.service import IngestService
from serve_app.ops.service import OpsService
from serve_app.profiles import ProfileSet
from serve_app.search.cache.semantic import SemanticCache
from serve_app.search.cache.store import build_store
from serve_app.search.retrieval import Retrieval
from serve_app.search.service import SearchService
from serve_app.settings import GatewaySettings
from serve_app.tools.runner import ToolRunner


@dataclass(frozen=True)
class Services:
    """The gateway's objects, built once by ``build_services``."""

    settings: GatewaySettings
    # What the services talk to; /readyz asks each of them (serve_app/ops/service.py).
    backends: Backends
    # Roles, doc types and resource policies.
    policy: Policy
    # Every allow/deny decision goes here (asynchronously; its ``log`` is the audit log).
    recorder: AuditRecorder
    authenticator: Authenticator
    # Per-agent RAG profiles, and the token buckets per credential and team.
    profiles: ProfileSet
    rate_limiter: RateLimiter
    # Chunk, embed, upsert: the ingest service's and the events route's.
    pipeline: IngestPipeline
    # The search pipeline rag.search_docs and rag.enrich_answer share, and the semantic
    # cache of rag.search_docs (None: disabled, or no state database for its generations).
    retrieval: Retrieval
    cache: SemanticCache | None
    # One service per feature folder.
    search: SearchService
    enrich: EnrichService
    ingest: IngestService
    graph: GraphTools
    ops: OpsService
    # The four agent tools, over HTTP (POST /tools/{function}) and MCP.
    tools: ToolRunner

    @property
    def shared(self) -> Shared:
        """The parts serve_app/http/deps.py reads (it may import no feature)."""
        return Shared(
            settings=self.settings,
            authenticator=self.authenticator,
            rate_limiter=self.rate_limiter,
            profiles=self.profiles,
            recorder=self.recorder,
        )


def build_services(
    settings: GatewaySettings,
    backends: Backends,
    *,
    count_tokens: TokenCounter | None = None,
    sources: SourceStore | None = None,
    policy: Policy | None = None,
    audit: AuditLog | None = None,
) -> Services:
    """The gateway over ``backends``. ``count_tokens`` (chunking and the context-token
    budget) defaults to the embedder's tokenizer; ``policy`` to ``auth.policy_file``;
    ``audit`` to the log ``settings.audit`` configures; ``sources`` is the source-document
    registry (``None`` keeps none).

    Raises:
        ValueError: the policy file, the profiles file or a configured key file is
            missing or invalid.
    """
    count = count_tokens or embedder_token_counter(settings.embedder)
    pipeline = build_pipeline(settings, backends, count_tokens=count, sources=sources)
    recorder = AuditRecorder(audit if audit is not None else AuditLog(settings.audit))
    policy = policy if policy is not None else Policy.load(settings.auth.policy_file)
    profiles = ProfileSet.load(settings.profiles.file)
    retrieval = Retrieval(
        settings=settings,
        embedder=backends.embedder,
        store=backends.store,
        graph=backends.graph,
        reranker=backends.reranker,
        count_tokens=count,
    )
    # The cache keys on the state database's index generations, which the pipeline's
    # registry provides.
    cache = (
        SemanticCache(
            settings.cache,
            build_store(settings.cache),
            pipeline.generations,
            retrieval.queries.vector,
        )
        if settings.cache.enabled and pipeline.generations is not None
        else None
    )
    graph = GraphTools(settings, backends.graph, policy, recorder)

    async def graph_written(team_id: str) -> None:
        # The write is done; if the generation cannot be raised, cached answers may lag.
        await pipeline.bump_generations({team_id})

    graph.on_write = graph_written
    search = SearchService(settings, policy, retrieval, recorder, profiles, cache)
    enrich = EnrichService(settings, policy, retrieval, recorder, profiles)
    # Background ingestion jobs live in the state database (none: every request inline).
    jobs = IngestJobs(pipeline.sources.engine) if pipeline.sources is not None else None
    ingest = IngestService(settings, policy, pipeline, recorder, jobs)
    rate_limiter = RateLimiter.from_settings(
        settings.rate_limit, settings.cache.backend, settings.cache.redis_url
    )
    return Services(
        settings=settings,
        backends=backends,
        policy=policy,
        recorder=recorder,
        authenticator=Authenticator.from_settings(settings),
        profiles=profiles,
        rate_limiter=rate_limiter,
        pipeline=pipeline,
        retrieval=retrieval,
        cache=cache,
        search=search,
        enrich=enrich,
        ingest=ingest,
        graph=graph,
        ops=OpsService(settings, backends, recorder, pipeline, ReindexJobs(settings), cache),
        tools=ToolRunner(search=search, enrich=enrich, graph=graph),
    )
