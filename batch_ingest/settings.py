"""Settings of ingestion (the pipeline, the bus consumer, reindex jobs) and their root.

``BatchSettings`` is the settings root of the batch entry points (``python -m
batch_ingest.consumer``, ``python -m batch_ingest.reindex``); the gateway's root,
``serve_app.settings.BatchSettings``, extends it. Environment variables: ``NATS__URL``,
``CHUNKING__MAX_TOKENS``, ``STATE__URL``, ``REINDEX__ACTORS``, ...
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from batch_ingest.event_types import SUBJECT_TYPES, notice_subject, stream_subjects
from deployments.config import PLACEHOLDER_SECRETS, EmbedderSettings, MilvusSettings, Neo4jSettings


class ChunkingSettings(BaseModel):
    """How documents are cut before embedding."""

    max_tokens: int = Field(200, ge=16, le=8192)
    overlap_tokens: int = Field(30, ge=0, le=1024)

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingSettings:
        if self.overlap_tokens >= self.max_tokens:
            raise ValueError("chunking.overlap_tokens must be smaller than chunking.max_tokens")
        return self


class StateSettings(BaseModel):
    """The gateway's own state: the source-document registry (batch_ingest/source_store.py)
    that reindex reads and the event consumer orders versions by."""

    # SQLAlchemy URL: a SQLite file (relative to the repository root) or PostgreSQL.
    url: str = "sqlite:///var/state.db"


class ReindexSettings(BaseModel):
    """The reindex job (batch_ingest/reindex/) and who may start it (POST /admin/reindex)."""

    # Embedding actors of the Ray Data pool, logical CPUs each (fractional: whole CPUs can
    # starve Ray Data's read tasks on a small machine), and documents per map_batches call.
    actors: int = Field(1, ge=1, le=256)
    num_cpus_per_actor: float = Field(0.5, gt=0, le=64)
    # Custom Ray resources each actor asks for, to place the pool on chosen nodes: e.g.
    # {"reindex": 1} with workers started `ray start --resources '{"reindex": 4}'` keeps the
    # job off the head and the Serve replicas' nodes (REINDEX__ACTOR_RESOURCES as JSON).
    actor_resources: dict[str, float] = Field(default_factory=dict)
    batch_size: int = Field(16, ge=1, le=4096)
    # Torch threads of each embedding actor when the model changes (0: the node's cores; a
    # reindex is a bulk job, and one thread left the second core of a 2-core machine idle:
    # 0.53x the raw model; bench/README.md "Reindex"). Set 1 to leave cores to searches.
    torch_threads: int = Field(0, ge=0, le=64)
    # How much lower the embedding actors' CPU priority is (Unix nice, 0-19): with every
    # core theirs, searches still get a core as soon as they need one.
    nice: int = Field(10, ge=0, le=19)
    # On Linux the embedding actors also run under SCHED_IDLE: a core goes to them only when
    # no search (no other process) wants it. The job's driver runs at ``nice`` only: it holds
    # the write barrier during the switch and must not be starved.
    idle_priority: bool = True
    # Seconds a job waits for the CPUs of its actor pool (Serve replicas or another job hold
    # them) before it fails naming what is missing.
    resource_wait_s: float = Field(300.0, ge=0)
    # Keep the replaced collection version for rollback (else it is dropped after the swap).
    keep_previous: bool = False
    # Who may start or read a job: a token permission (every team), or one of these roles in
    # the team (that team only).
    admin_permission: str = "admin:reindex"
    admin_roles: list[str] = Field(default_factory=lambda: ["owner"])
    # How the admin API runs a job: "ray" (a Ray task on the Serve cluster), "subprocess"
    # (the CLI, for a gateway running without Ray), or "auto" (ray when Ray is initialised).
    runner: Literal["auto", "ray", "subprocess"] = "auto"
    # A running job writes its row's heartbeat_at this often (a thread of its own, so model
    # loading or a long batch still beats); readers take an active job whose heartbeat is
    # older than stale_after_s as dead: shown "stalled", resumable, no longer blocking.
    heartbeat_s: float = Field(5.0, gt=0, le=300)
    stale_after_s: float = Field(30.0, gt=0, le=86400)

    @model_validator(mode="after")
    def _stale_after_several_beats(self) -> ReindexSettings:
        if self.stale_after_s < 3 * self.heartbeat_s:
            raise ValueError(
                "reindex.stale_after_s must be at least 3 × reindex.heartbeat_s (one late "
                "heartbeat must not make a live job look dead)"
            )
        return self


class ConsumerSettings(BaseModel):
    """The NATS JetStream consumer (batch_ingest/consumer.py): ``NATS__URL`` etc.; its
    command-line flags override them."""

    url: str = "nats://127.0.0.1:4222"
    stream: str = "RAG_EVENTS"
    durable: str = "rag-ingest"
    subject_prefix: str = ""
    batch: int = Field(16, ge=1, le=4096)
    fetch_timeout_s: float = Field(1.0, gt=0)
    # Deliveries of an event that failed for a lasting cause (a document the store refuses)
    # before it goes to the dead-letter stream.
    max_deliver: int = Field(5, ge=1)
    # Seconds before the 2nd, 3rd, ... delivery; fewer steps than max_deliver (server rule).
    backoff_s: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0)
    # An event that failed for a passing cause (Milvus, Neo4j or the embedder unavailable, a
    # document busy, the registry unwritten) is not poison: it is retried, at most
    # retry_max_delay_s apart, until it applies or is retry_for_s old (then dead-lettered).
    retry_for_s: float = Field(24 * 3600, gt=0)
    retry_max_delay_s: float = Field(15.0, gt=0)
    max_ack_pending: int = Field(1000, ge=1)
    max_age_s: float = Field(7 * 24 * 3600, gt=0)
    duplicate_window_s: float = Field(120.0, gt=0)
    # Also read the type-only subjects of before issue 34 (``doc.upserted``): whoever may
    # publish there writes into any team. For a migration only; off, an event published there
    # is refused (dead-lettered) and the stream no longer takes them.
    legacy_subjects: bool = False
    # An event larger than this (bytes of the message: a long document, a minute of
    # embedding on a CPU) is applied in the consumer's slow lane, one at a time beside the
    # fetch loop, so small events never wait behind it (batch_ingest/events/slow_lane.py).
    large_event_bytes: int = Field(256 * 1024, ge=1)
    # The consumer's credential: an nkey seed file (empty: var/nats/auth/consumer.nk of the
    # repository when it exists, as scripts/services.py makes it; else anonymous) and TLS
    # (a CA bundle to verify the server, a client certificate and key when it asks for one).
    nkey_seed_file: str = ""
    # Prometheus /metrics of the consumer (batch_ingest/consumer_metrics.py); 0: not served.
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""

    @model_validator(mode="after")
    def _retries_end_before_the_stream_drops(self) -> ConsumerSettings:
        if self.retry_for_s >= self.max_age_s:
            raise ValueError(
                f"nats.retry_for_s ({self.retry_for_s:g}) must be below nats.max_age_s "
                f"({self.max_age_s:g}): the stream drops older events, retried or not"
            )
        return self

    def subject(self, name: str) -> str:
        return f"{self.subject_prefix}{name}"

    @property
    def subjects(self) -> list[str]:
        """The event stream's subjects: ``rag.team.*.<type>`` (and the type-only ones with
        ``legacy_subjects``)."""
        legacy = [self.subject(t) for t in SUBJECT_TYPES] if self.legacy_subjects else []
        return stream_subjects(self.subject_prefix) + legacy

    @property
    def dlq_stream(self) -> str:
        return f"{self.stream}_DLQ"

    def dlq_subject(self, event_type: str) -> str:
        return self.subject(f"rag.dlq.{event_type or 'invalid'}")

    def notice_subject(self, team_id: str, kind: str) -> str:
        """Where the team's ``rag.document.indexed`` / ``deleted`` notices go."""
        return notice_subject(team_id, kind, self.subject_prefix)

    def backoff_for(self, delivered: int) -> float:
        steps = self.backoff_s or (1.0,)
        return steps[min(max(delivered, 1), len(steps)) - 1]


class AuditSettings(BaseModel):
    """The audit log of every access decision: the gateway's (serve_app/audit/log.py) and the bus
    consumer's (batch_ingest/events/bus_audit.py), one table."""

    enabled: bool = True
    # SQLAlchemy URL: a SQLite file (relative paths are relative to the repository root) or
    # PostgreSQL, e.g. postgresql+psycopg://rag_audit:secret@127.0.0.1:5433/rag_audit.
    url: str = "sqlite:///var/audit.db"
    table: str = Field("audit_decisions", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    # Store the raw query text too (off: only its sha256 is kept).
    store_query_text: bool = False
    # Records per INSERT, and the longest a record waits before it is written.
    batch_size: int = Field(200, ge=1, le=10_000)
    flush_interval_s: float = Field(0.5, gt=0, le=60)
    # Records kept in memory while the database is down; beyond that the oldest are dropped
    # (and counted). Seconds a shutdown waits for the last records.
    max_pending: int = Field(100_000, ge=1)
    shutdown_timeout_s: float = Field(10.0, ge=0)
    retry_interval_s: float = Field(2.0, gt=0)
    # Records older than this many days are deleted by the gateway's writer, at most once per
    # prune_interval_s, prune_batch rows per transaction (0: keep every record). Without it
    # the table grows forever and every insert updates four ever deeper indexes.
    retention_days: float = Field(90.0, ge=0)
    prune_interval_s: float = Field(3600.0, gt=0)
    prune_batch: int = Field(5000, ge=1, le=100_000)
    # Who may read it over GET /audit/decisions: a token permission (every team), or one of
    # these roles in the team asked for (that team only).
    read_permission: str = "audit:read"
    reader_roles: list[str] = Field(default_factory=lambda: ["owner"])
    max_query_limit: int = Field(1000, ge=1)
    # Whether /readyz answers 503 while the audit database is down (else it only reports it).
    required_for_ready: bool = False


class BatchSettings(BaseSettings):
    """The settings root of ingestion, the bus consumer and reindex jobs, read from the
    environment (and from arguments, which take precedence)."""

    model_config = SettingsConfigDict(
        env_nested_delimiter="__", env_prefix="", extra="ignore", case_sensitive=False
    )

    environment: Literal["development", "test", "production"] = "development"
    embedder: EmbedderSettings = EmbedderSettings()
    # The model a change of embedding model moves to (docs/operations.md, "Changing the
    # embedding model"): while set, the Embedder also serves it, a reindex embeds with it, and
    # a search or write of a team is embedded with the model of the version it reaches.
    # ``None``: no change under way.
    embedder_next: EmbedderSettings | None = None
    milvus: MilvusSettings = MilvusSettings()
    neo4j: Neo4jSettings = Neo4jSettings()
    state: StateSettings = StateSettings()
    chunking: ChunkingSettings = ChunkingSettings()
    reindex: ReindexSettings = ReindexSettings()
    nats: ConsumerSettings = ConsumerSettings()
    audit: AuditSettings = AuditSettings()

    @property
    def embedders(self) -> list[EmbedderSettings]:
        """The models served: the primary, then the next one during a model change."""
        nxt = self.embedder_next
        if nxt is None or nxt.embed_model_tag == self.embedder.embed_model_tag:
            return [self.embedder]
        return [self.embedder, nxt]

    @property
    def reindex_embedder(self) -> EmbedderSettings:
        """The model a reindex embeds with: the next one while a model change is under way."""
        return self.embedders[-1]

    @model_validator(mode="after")
    def _no_placeholder_secrets_in_production(self) -> BatchSettings:
        if self.environment == "production" and self.neo4j.password in PLACEHOLDER_SECRETS:
            raise ValueError(
                "neo4j.password is a placeholder; set NEO4J__PASSWORD to the real secret "
                "before running with ENVIRONMENT=production"
            )
        return self
