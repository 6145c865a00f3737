"""``reindex(team_id)``: re-chunk and re-embed one tenant into a new collection version, then
swap its alias — searches never see a half-built index.

    python -m batch_ingest.reindex --team dao_greenfood [--resume] [--actors 2] [--batch-size 32]
    python -m batch_ingest.reindex --team dao_greenfood --status | --clean-up

Steps (a job row in the state database, ``batch_ingest.reindex.state``, records each one):

1. The team's alias ``<base>__<slug>`` points to ``__v<n>``; create ``__v<n+1>`` with the same
   schema and indexes (``CollectionVersions.create``).
2. Read the team's live documents from the source registry (``SourceStore``); re-chunk them
   with the current chunker and embed them with the current embedder settings in a Ray Data
   actor pool (``map_batches`` over a callable class holding the model, fractional CPUs,
   ``repartition`` so blocks spread over the actors); each batch is upserted into ``__v<n+1>``
   by the actor and recorded as done by the driver.
3. Catch up on documents ingested or deleted while the job ran (``SourceStore.changed_since``).
4. Verify: rows in ``__v<n+1>`` == the chunk count the re-chunking produced, and no row has an
   ``embed_model`` other than the current tag. A mismatch fails the job; the alias is untouched.
5. ``alter_alias`` to ``__v<n+1>`` (one atomic call), catch up once more on writes that reached
   ``__v<n>`` during the checks, then drop the old version (``--keep-previous`` keeps exactly
   one previous version for rollback instead).

``--resume`` continues the team's unfinished job into the same target version: recorded
documents are skipped outright; the others are re-chunked and looked up by their deterministic
chunk ids in the target, and only those missing or different are embedded again.

Without Ray (``--engine local``) the same worker runs in-process, batch after batch.

While it runs the job's driver beats a heartbeat in its row; a job whose heartbeat stopped
reads as ``stalled`` and can be resumed, one that is alive cannot be resumed twice. A team
with no documents and no collection is refused (``--allow-empty`` builds it empty on
purpose). ``--clean-up`` supersedes the team's dead jobs and drops their half-built versions.

Modules: ``options`` (a run's options, result and error), ``state`` (job rows and their
status machine), ``worker`` (re-chunk, embed and upsert one batch), ``engines`` (Ray Data or
in-process), ``private_ray`` (the local Ray a driver starts), ``progress``, ``heartbeat`` and
``liveness`` (alive, stalled), ``priority``, ``entry`` and ``pool`` (the job's processes on
Ray yield the cores to searches), ``team`` (unknown teams), ``claim`` (which job a run works
on), ``cleanup`` (half-built versions), ``job`` (``Reindexer``: the steps above),
``writer`` (the bulk pass and the catch-ups into the target), ``record`` (each finished batch
in the job's row), ``switch`` (the replicas told, the last catch-up, the alias switch),
``finish`` (what is live recorded, the other versions dropped), ``launcher`` (the jobs the
admin API starts) and ``cli`` (``python -m batch_ingest.reindex``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batch_ingest.reindex.job import Reindexer, reindex
    from batch_ingest.reindex.options import ReindexError, ReindexOptions, ReindexResult

__all__ = ["ReindexError", "ReindexOptions", "ReindexResult", "Reindexer", "reindex"]

# Imported on first use: the processes a job starts on Ray import this package before they
# can lower their CPU priority (``entry``, ``pool``), and must find nothing heavy here.
_LAZY = {
    "Reindexer": "batch_ingest.reindex.job",
    "reindex": "batch_ingest.reindex.job",
    "ReindexError": "batch_ingest.reindex.options",
    "ReindexOptions": "batch_ingest.reindex.options",
    "ReindexResult": "batch_ingest.reindex.options",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_LAZY[name]), name)
