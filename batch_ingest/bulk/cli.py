"""Import files of documents into one team on Ray Data, through the gateway's pipeline.

    python -m batch_ingest.bulk docs.jsonl --team dao_x
    python -m batch_ingest.bulk corpus/ --team dao_x --actors 2 --batch-size 32
    python -m batch_ingest.bulk docs.parquet --team dao_x --local     # no Ray: this process
    python -m batch_ingest.bulk corpus/ --team dao_x --dry-run        # validate and count

The input is a JSON-lines file, a Parquet file, or a folder of both (batch_ingest/bulk/
sources.py); a Markdown vault is exported to JSON lines first (``python -m serve_app.cli.vault
VAULT --team T --export FILE.jsonl``). Every row is validated before anything is written: a
bad row, or one of another team, stops the job naming its file, line or row and field (exit
2). Then the documents go through ``IngestPipeline`` (the bus consumer's, batch_ingest/
consumer.py) on a Ray Data actor pool sized by ``reindex.*`` (``RAY_ADDRESS``, else a private
local Ray): idempotent (an unchanged document is not embedded again), ACLs stored as given,
graph, source registry and change log written. A failed document is tried once more; the
summary lists what still failed by id (exit 1). Each run writes one audit record
(``ops.bulk_import``, the team and the counts) in the gateway's audit log, which is checked
before anything is written.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from batch_ingest.audit_store import AuditRecord, AuditStore
from batch_ingest.bulk.job import BulkJob, BulkOptions, BulkResult
from batch_ingest.bulk.sources import InputError, Row, read_documents
from batch_ingest.bulk.worker import BulkWorker
from batch_ingest.settings import BatchSettings

if TYPE_CHECKING:
    from batch_ingest.pipeline import IngestPipeline

ACTION = "ops.bulk_import"
# Failed documents listed in the summary, at most (the audit record counts them all).
MAX_LISTED = 200

logger = logging.getLogger("batch_ingest.bulk")


def audit_record(
    team: str, source: str, result: BulkResult, operator: str, error: str = ""
) -> AuditRecord:
    """The run's record: who imported what into which team, and the counts."""
    reason = result.counts() + (f" error={error}" if error else "")
    return AuditRecord(
        action=ACTION,
        decision="allow",
        reason=reason[:256],
        http_status=0,
        subject=operator,
        auth_method="cli",
        team_id=team,
        resource=f"team:{team}/bulk:{source}",
        latency_ms=round(result.took_s * 1000, 1),
        path="batch_ingest.bulk",
    )


def parse_args(argv: list[str] | None, settings: BatchSettings) -> argparse.Namespace:
    pool = settings.reindex
    p = argparse.ArgumentParser(
        prog="python -m batch_ingest.bulk", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("input", type=Path, help="a .jsonl or .parquet file, or a folder of them")
    p.add_argument("--team", required=True, help="the team every document is written to")
    p.add_argument("--local", action="store_true", help="no Ray: one worker in this process")
    p.add_argument("--dry-run", action="store_true", help="validate and count; write nothing")
    p.add_argument("--batch-size", type=int, default=pool.batch_size,
                   help="documents per worker call (reindex.batch_size)")  # fmt: skip
    p.add_argument("--actors", type=int, default=pool.actors,
                   help="workers of the Ray Data pool (reindex.actors)")  # fmt: skip
    p.add_argument("--num-cpus-per-actor", type=float, default=pool.num_cpus_per_actor,
                   help="CPUs each actor asks Ray for (reindex.num_cpus_per_actor)")  # fmt: skip
    p.add_argument("--operator", default=None, help="who imports (default: the login name)")
    p.add_argument("--audit-url", default=settings.audit.url)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for name in ("batch_size", "actors", "num_cpus_per_actor"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(
    argv: list[str] | None = None,
    *,
    settings: BatchSettings | None = None,
    pipeline: IngestPipeline | None = None,
) -> int:
    """Run the command; ``settings`` replace ``BatchSettings()`` and ``pipeline`` (with
    ``--local``) the one built from them (tests)."""
    settings = settings or BatchSettings()
    args = parse_args(argv, settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        rows = read_documents(args.input, args.team)
    except InputError as exc:
        print(f"error: {exc}; nothing was written", file=sys.stderr)
        return 2
    if args.dry_run:
        print(dry_run_summary(rows, args.team))
        return 0
    if pipeline is not None and not args.local:
        raise ValueError("an injected pipeline runs in this process only (--local)")

    source = str(args.input.resolve())
    try:
        audit = AuditStore(args.audit_url, settings.audit.table)
        audit.create()  # nothing is written unless its record can be
    except Exception as exc:  # noqa: BLE001 (said, exit 1)
        print(f"error: the audit log cannot be written ({exc}); nothing was written",
              file=sys.stderr)  # fmt: skip
        return 1
    options = BulkOptions(
        team_id=args.team,
        engine="local" if args.local else "ray",
        batch_size=args.batch_size,
        actors=args.actors,
        num_cpus_per_actor=args.num_cpus_per_actor,
        progress=not args.no_progress,
    )
    factory = None if pipeline is None else (lambda: BulkWorker({}, args.team, pipeline=pipeline))
    job = BulkJob(settings, options, worker_factory=factory)
    error = ""
    try:
        result = job.run(rows)
    except Exception as exc:  # noqa: BLE001 (the record and the summary say it; exit 1)
        logger.exception("bulk import stopped")
        error = f"{type(exc).__name__}: {exc}"
        result = job.result
    operator = args.operator or getpass.getuser()
    try:
        audit.insert([audit_record(args.team, source, result, operator, error)])
    except Exception as exc:  # noqa: BLE001 (said, exit 1)
        error = error or f"the audit record was not written: {exc}"
        print(f"error: the audit record was not written: {exc}", file=sys.stderr)
    finally:
        audit.dispose()
    print(summary(result))
    if error:
        print(f"error: {error}; re-run to finish (documents already written stay unchanged)",
              file=sys.stderr)  # fmt: skip
    return 1 if error or result.failed else 0


def dry_run_summary(rows: list[Row], team: str) -> str:
    files = {r.file for r in rows}
    chars = sum(len(r.doc.text) for r in rows)
    acl = sum(1 for r in rows if r.doc.acl is not None and r.doc.acl.restricts)
    confidential = sum(1 for r in rows if r.doc.visibility == "confidential")
    return (
        f"dry run: {len(rows)} documents of team {team} in {len(files)} files, {chars} "
        f"characters; {acl} with an ACL, {confidential} confidential; nothing was written"
    )


def summary(result: BulkResult) -> str:
    docs = result.indexed + result.unchanged
    lines = [
        f"done in {result.took_s:.1f} s: {result.documents} documents, indexed "
        f"{result.indexed}, unchanged {result.unchanged}, failed {len(result.failed)} "
        f"(retried {result.retried}); {result.chunks} chunks ({result.chunks_per_s:.1f}/s, "
        f"{docs / max(result.took_s, 1e-9):.1f} documents/s)"
    ]
    for f in result.failed[:MAX_LISTED]:
        lines.append(f"  not imported: {f.where} ({f.doc_type}:{f.doc_id}): {f.error[:300]}")
    if len(result.failed) > MAX_LISTED:
        lines.append(f"  ... and {len(result.failed) - MAX_LISTED} more")
    return "\n".join(lines)
