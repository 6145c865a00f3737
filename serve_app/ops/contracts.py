"""Request and response models of the operator routes: the audit log (/audit/decisions), the
embedding ledger (/admin/usage) and tenant reindexing (/admin/reindex). Every field is in
every answer, null where it has no value (no field is left out)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from batch_ingest.reindex.state import JobStatus


class AuditDecision(BaseModel):
    """One audited decision: a row of the audit table (batch_ingest/audit_store.py)."""

    id: int
    ts: str = Field(description="ISO 8601, UTC")
    trace_id: str
    subject: str
    auth_method: str
    key_id: str
    agent_id: str
    declared_agent_id: str
    team_id: str
    action: str
    resource: str
    decision: str = Field(description="allow or deny")
    reason: str
    http_status: int
    query_sha256: str | None
    query_text: str | None
    doc_ids: list[str] | None
    chunk_ids: list[str] | None
    groups: list[str] | None
    latency_ms: float | None
    path: str


class AuditDecisionsResponse(BaseModel):
    decisions: list[AuditDecision] = Field(description="newest first")
    count: int
    trace_id: str


class UsageEntry(BaseModel):
    """Passage tokens and chunks embedded for one team, source and UTC day."""

    team_id: str
    source: str = Field(description="api, bus, reindex or bulk")
    day: str = Field(description="YYYY-MM-DD, UTC")
    tokens: int
    chunks: int


class UsageTotal(BaseModel):
    tokens: int
    chunks: int


class EmbeddingUsageResponse(BaseModel):
    usage: list[UsageEntry]
    totals: dict[str, UsageTotal] = Field(description="per team, over the rows of `usage`")
    trace_id: str


class ReindexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    team_id: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[^\x00-\x1f]+$",
        validation_alias=AliasChoices("team_id", "dao_id", "microdao_id"),
    )
    # Build a team with no documents and no collection on purpose (else 404 unknown_team).
    allow_empty: bool = False


class ReindexJobResponse(BaseModel):
    """A reindex job (batch_ingest/reindex/state.py ``ReindexJob.public``)."""

    job_id: str
    team_id: str
    status: JobStatus
    embed_model: str
    source_version: int | None
    target_version: int | None
    total_docs: int
    done_docs: int
    skipped_docs: int
    expected_chunks: int
    written_chunks: int
    rows_in_target: int | None
    rate_chunks_s: float
    eta_s: float | None
    error: str | None
    # What a running job waits on, or how to continue a stalled one.
    note: str | None
    snapshot_at: str | None
    options: dict[str, Any]
    created_at: str | None
    updated_at: str | None
    finished_at: str | None
    heartbeat_at: str | None
    progress: float | None = Field(description="done_docs / total_docs; null before counting")
    trace_id: str
