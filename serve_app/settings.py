"""Settings of the gateway itself (search, enrich, ingestion limits, auth, audit) and its
root, ``GatewaySettings``: ``BatchSettings`` (the backends and ingestion) plus these sections.
Environment variables: ``SEARCH__MODE``, ``AUTH__MODE``, ``AUDIT__URL``, ...
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from batch_ingest.settings import BatchSettings
from deployments.config import PLACEHOLDER_SECRETS, RerankerSettings

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


# What a search does with near-duplicate passages (SearchSettings.near_duplicates).
NearDuplicates = Literal["collapse", "drop", "off"]


class SearchSettings(BaseModel):
    """Defaults and bounds of rag.search_docs."""

    default_top_k: int = Field(5, ge=1)
    max_top_k: int = Field(50, ge=1)
    # The longest a query embedding (search, enrich claims) and a rerank may take: past it
    # the search answers BM25 only / in fused order, degraded, instead of waiting for an
    # Embedder or Reranker replica that died (Serve replaces it in ~10 s) or never answers.
    embed_deadline_s: float = Field(3.0, gt=0, le=120)
    rerank_deadline_s: float = Field(3.0, gt=0, le=120)
    # Graph-scoped retrieval: the entity lookup in Neo4j, after which the search goes on
    # without the graph, degraded (the graph tools themselves have neo4j.deadline_s).
    graph_deadline_s: float = Field(2.0, gt=0, le=120)
    # A candidate search in the Retriever (Milvus or its in-memory index): past it, 503.
    store_deadline_s: float = Field(10.0, gt=0, le=300)
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
    # With an embedder that makes learned sparse weights (embedder.backend flag_m3, BGE-M3)
    # hybrid search fuses a third list, those weights by inner product, with this base
    # weight (BGE-M3's authors weigh sparse 0.3 beside dense 1; 0 leaves it out).
    lexical_weight: float = Field(0.3, ge=0.0)
    # fusion "adaptive": per query, each method's weight × (confidence of its candidate list,
    # serve_app.search.ranking.list_confidence over the first adaptive_k) ** adaptive_gamma.
    adaptive_gamma: float = Field(1.0, ge=0.0, le=10.0)
    adaptive_k: int = Field(10, ge=2, le=100)
    adaptive_measure: Literal["relgap", "peak", "margin"] = "relgap"
    # Word-4-gram Jaccard at or above which two passages count as near-duplicates.
    near_duplicate_threshold: float = Field(0.8, gt=0.0, le=1.0)
    # What rag.search_docs does with a passage that nearly repeats a better-ranked one:
    # "collapse" keeps it, at its rank and counted in top_k, when it comes from another
    # document, as a match with an empty snippet and "duplicate_of" naming the passage it
    # repeats (every source of the text is cited, its text returned once; a repeat within
    # one document is dropped); "drop" drops every repeat (more distinct passages in top_k,
    # the other sources unnamed); "off" keeps every passage as it is. bench/README.md,
    # "Near-duplicates and ranking quality".
    near_duplicates: NearDuplicates = "collapse"
    # Drop matches scoring below this (in the final score's scale); None keeps all.
    min_score: float | None = None
    # Token budget of all returned passages together; None = no budget.
    max_context_tokens: int | None = Field(None, ge=1)
    snippet_chars: int = Field(320, ge=40, le=4000)
    # Passages whose shingles and sentences a replica keeps between searches (the ones
    # returned lately; ~11 KB each); 0 derives them for every search.
    passage_memo: int = Field(2048, ge=0, le=200_000)
    max_query_chars: int = Field(2000, ge=1)


class IngestSettings(BaseModel):
    """Bounds on one ingestion request."""

    max_documents: int = Field(256, ge=1)
    max_document_chars: int = Field(2_000_000, ge=1)
    # A request with more characters than this (all documents together) is indexed in the
    # background: 202 with a job id, GET /ingest/jobs/{job_id} for its state. 200,000
    # characters are ~250 chunks, ~20 s on 2 CPU cores (the proxy gives a request 120 s).
    sync_max_chars: int = Field(200_000, ge=1)
    # A background job's lease; a replica that stops renewing it loses the job to another.
    job_lease_s: float = Field(60.0, gt=1.0)


class EnrichSettings(BaseModel):
    """Bounds and support thresholds of rag.enrich_answer (serve_app/enrich/service.py).

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
    # Verified JWTs kept per replica (the exact token string -> its principal), so a token sent
    # on many requests is verified once; least recently used go first; 0 = off.
    token_cache_size: int = Field(4096, ge=0)
    # Seconds a cached verification is trusted before the token is verified in full again: how
    # long a key removed from the JWKS can keep verifying cached tokens (exp is checked on
    # every hit). 0 = off.
    token_cache_s: float = Field(60.0, ge=0)
    claims: ClaimNames = ClaimNames()
    # Roles of a team listed in the token without roles of its own (list form, no roles claim).
    default_team_roles: list[str] = Field(default_factory=lambda: ["member"])
    # API keys of service agents: a YAML/JSON file of hashed keys (python -m serve_app.auth).
    api_keys_file: str = ""
    # HMAC key of the stored API key hashes; kept outside the key file.
    api_key_pepper: SecretStr = SecretStr("")
    # Seconds between checks whether the API key file changed (revocations apply then).
    api_keys_reload_s: float = Field(5.0, ge=0)
    # Policy YAML (roles, doc types, project and skill policies); "" = serve_app/access/policy.yaml.
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


class CacheSettings(BaseModel):
    """The semantic cache of rag.search_docs (serve_app/search/cache/): answers kept per agent,
    team, compiled access scope and index generation, found again for the same or a
    near-duplicate query (cosine of the query embeddings at least ``similarity``) within
    ``ttl_s``."""

    enabled: bool = True
    # "memory": one cache per ingress replica (the embedded default); "redis": shared by all
    # replicas, at ``redis_url``.
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Prefix of every Redis key, so one Redis can serve several gateways.
    redis_prefix: str = Field("rag:cache:", min_length=1, max_length=64)
    # Seconds an answer is served from the cache (a profile may set its own, never longer).
    ttl_s: float = Field(300.0, gt=0, le=86_400)
    # Cosine of two query embeddings from which the second is answered with the first's
    # result; 1.0 keeps only exact repeats (after whitespace and case folding).
    similarity: float = Field(0.95, ge=0.5, le=1.0)
    # What a near duplicate must also pass before it is served (issue 38, item 7): "lexical"
    # — the two queries' content words agree (serve_app/search/cache/wording.py: numbers, versions
    # and negations exactly; the other words with a multiset Jaccard of at least
    # ``near_min_jaccard``, 1.0 = the same words in any order, case or punctuation); "off" —
    # the cosine alone decides. A refused near duplicate is a miss (status "near_refused").
    near_check: Literal["lexical", "off"] = "lexical"
    near_min_jaccard: float = Field(1.0, ge=0.5, le=1.0)
    # Entries kept in memory (least recently used dropped first), and per bucket (one bucket
    # per agent, team, scope, request shape and generation: the near-duplicate scan's length).
    max_entries: int = Field(10_000, ge=1)
    max_per_bucket: int = Field(256, ge=1, le=10_000)
    # Seconds a Redis call may take before the cache is skipped (the search runs uncached).
    redis_timeout_s: float = Field(0.25, gt=0, le=10)


class HttpSettings(BaseModel):
    """Bounds on reading a request (serve_app/http/body_limits.py)."""

    # A longer URL (path and query string) is refused with 414. At most 12,288: in front of
    # the gateway, HAProxy (deployments/serve_env.py) refuses a request head over its 16 KiB
    # buffer itself, with an HTML 400 (docs/operations.md, "Request limits").
    max_url_bytes: int = Field(8192, ge=256, le=12_288)
    # The whole body must arrive within this time (408 otherwise).
    body_read_timeout_s: float = Field(30.0, gt=0.0)
    # A larger body is refused with 413 (64 MiB: a few long documents per request).
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)


class RateLimitSettings(BaseModel):
    """``RATE_LIMIT__*`` (serve_app/http/rate_limits.py). Generous defaults: a 2-core machine
    serves ~100 searches/s in all (bench/README.md, "Search plumbing"), so they only stop a
    runaway client, never a busy team on a bigger machine; set them per deployment."""

    enabled: bool = True
    per_credential_per_s: float = Field(200.0, gt=0, le=1_000_000)
    per_credential_burst: int = Field(400, ge=1, le=10_000_000)
    per_team_per_s: float = Field(1_000.0, gt=0, le=1_000_000)
    per_team_burst: int = Field(2_000, ge=1, le=10_000_000)
    # "memory": per replica; "redis": shared by all replicas at redis_url (empty: the
    # cache's cache.redis_url); "auto": redis when cache.backend is redis.
    backend: Literal["auto", "memory", "redis"] = "auto"
    redis_url: str = ""
    redis_prefix: str = Field("rag:rl:", min_length=1, max_length=64)
    redis_timeout_s: float = Field(0.25, gt=0, le=10)


class SurfaceSettings(BaseModel):
    """Who may read the operator surface (serve_app/ops/surface.py). ``auto`` closes it
    whenever authentication is on (``auth.mode`` jwt: every request needs a credential) or
    ENVIRONMENT=production, and leaves it open only in ``auth.mode`` dev (a laptop, where a
    request without credentials is trusted anyway). ``open`` / ``full`` open it explicitly."""

    # /docs, /redoc, /openapi.json and GET /tools: "open" to anyone, "credential" for any
    # caller whose credential verifies.
    catalog: Literal["auto", "open", "credential"] = "auto"
    # /readyz: "full" shows each component's details (model path, URIs, errors); "status"
    # only whether each is ready, the details for a caller holding ``details_permission``.
    readyz: Literal["auto", "full", "status"] = "auto"
    details_permission: str = "ops:read"


class ProfileSettings(BaseModel):
    """Per-agent RAG profiles (serve_app/profiles.py): a YAML file keyed by agent id; empty
    uses the packaged serve_app/profiles.yaml."""

    file: str = ""
    # The permission a credential needs before its X-Agent-Id header names the profile (a
    # router calling for its agents); any other credential gets the profile of its own
    # verified agent id, or the default.
    route_permission: str = "rag:route_agents"


class GatewaySettings(BatchSettings):
    """All configuration of the gateway, read from the environment and from app args."""

    reranker: RerankerSettings = RerankerSettings()
    search: SearchSettings = SearchSettings()
    ingest: IngestSettings = IngestSettings()
    enrich: EnrichSettings = EnrichSettings()
    auth: AuthSettings = AuthSettings()
    cache: CacheSettings = CacheSettings()
    profiles: ProfileSettings = ProfileSettings()
    http: HttpSettings = HttpSettings()
    surface: SurfaceSettings = SurfaceSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()

    @property
    def surface_open_by_default(self) -> bool:
        """What ``surface`` ``auto`` means: open only where authentication is off (dev mode,
        outside production); closed as soon as credentials are required."""
        return self.auth.mode == "dev" and self.environment != "production"

    @property
    def catalog_needs_credential(self) -> bool:
        """Whether /docs, /redoc, /openapi.json and GET /tools ask for a credential."""
        if self.surface.catalog == "auto":
            return not self.surface_open_by_default
        return self.surface.catalog == "credential"

    @property
    def readyz_details_open(self) -> bool:
        """Whether /readyz shows component details (paths, URIs, errors) to anyone."""
        if self.surface.readyz == "auto":
            return self.surface_open_by_default
        return self.surface.readyz == "full"

    @property
    def memory_index_in_ingress(self) -> bool:
        """Whether each Ingress replica holds the in-memory index (``milvus.memory_index.
        serve_from``; ``auto``: yes unless the embedder makes learned sparse weights, whose
        search runs in Milvus through the Retriever anyway)."""
        mem = self.milvus.memory_index
        if not mem.enabled or mem.serve_from == "retriever":
            return False
        return mem.serve_from == "ingress" or not self.embedder.lexical

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
