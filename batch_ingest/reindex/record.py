"""What a reindex job writes in its row while it runs, beside its status: each finished batch
(the documents done and their chunk counts, the chunks written, the progress) and what the job
waits on. ``Reindexer`` hands these to the engines and catch-ups as callbacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batch_ingest.documents import make_chunk_id
from batch_ingest.reindex.engines import BatchSink
from batch_ingest.reindex.progress import Progress
from batch_ingest.reindex.state import ReindexJob, ReindexState
from deployments.vector_store.versions import CollectionVersions


def batch_sink(
    job: ReindexJob,
    done: dict[tuple[str, str], int],
    progress: Progress | None,
    state: ReindexState,
    versions: CollectionVersions,
) -> BatchSink:
    """The sink that records each finished batch of ``job``: the documents' chunk counts in
    ``done`` and the job's done records, the written and skipped counts on ``job``, and
    ``progress`` (``None``: not reported)."""
    team = job.team_id

    def sink(rows: list[dict[str, Any]]) -> None:
        batch: dict[tuple[str, str], int] = {}
        stale: list[str] = []
        for r in rows:
            key = (r["doc_type"], r["doc_id"])
            before = done.get(key)
            # A document that shrank (changed during the job) leaves chunk ids behind.
            if before is not None and before > r["chunks"]:
                stale += [
                    make_chunk_id(team, key[0], key[1], i) for i in range(r["chunks"], before)
                ]
            batch[key] = r["chunks"]
            job.written_chunks += r["embedded"]
            if not r["embedded"]:
                job.skipped_docs += 1
        if stale and job.target_version is not None:
            physical = versions.name(team, job.target_version)
            versions.delete(physical, stale)
        state.mark_done(job.job_id, batch)
        new = sum(1 for k in batch if k not in done)
        done.update(batch)
        if progress is not None:
            progress.add(new, sum(r["embedded"] for r in rows))

    return sink


def noter(job: ReindexJob, state: ReindexState) -> Callable[[str | None], None]:
    """Records what ``job`` waits on (``None``: nothing) in its row at once."""

    def note(text: str | None) -> None:
        if job.note != text:
            job.note = text
            state.save(job)

    return note
