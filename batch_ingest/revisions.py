"""The operator's path to a document's recorded revision: show it, or reset it, audited.

A document moves only to a newer revision: an event whose revision is not above the one the
source registry records is ``skipped_stale``. A producer that published a wrong, huge revision
(anything up to 2^53 - 1 validates) therefore freezes the document for every later event.
``reset`` sets the recorded revision back (by default to none, so the next event of any
revision applies) after writing an audit record of who did it and why, in the gateway's audit
log (action ``ops.revision_reset``; nothing is changed when that record cannot be written):

    python -m batch_ingest.revisions show --team dao_x --doc-id note-1
    python -m batch_ingest.revisions reset --team dao_x --doc-id note-1 \\
        --operator alice --reason "producer published revision 9e15 by mistake" [--to 1700000000000]

The text indexed and its chunks are not touched: the next event for the document replaces
them as usual. Exit status 0 done, 1 the audit log or the registry failed, 2 a usage error or
no such document.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from batch_ingest.audit_store import AuditRecord, AuditStore
from batch_ingest.events.envelope import MAX_REVISION
from batch_ingest.settings import BatchSettings
from batch_ingest.source_store import Key, SourceStore

ACTION = "ops.revision_reset"


def reset(
    sources: SourceStore,
    audit: AuditStore,
    key: Key,
    *,
    operator: str,
    reason: str,
    to: int | None = None,
) -> int | None:
    """Audit, then set the recorded revision of ``key`` to ``to``; the old revision.

    Raises:
        KeyError: the registry has no row for ``key`` (nothing audited or changed).
        ValueError: ``to`` out of range or an empty reason.
    """
    if to is not None and not 0 <= to <= MAX_REVISION:
        raise ValueError(f"--to must be between 0 and {MAX_REVISION}, got {to}")
    if not reason.strip():
        raise ValueError("--reason is required: the audit log says why")
    row = sources.get(key)
    if row is None:
        raise KeyError(key)
    team, doc_type, doc_id = key
    target = "none" if to is None else str(to)
    audit.insert(
        [
            AuditRecord(
                action=ACTION,
                decision="allow",
                reason=reason.strip()[:256],
                http_status=0,
                subject=operator,
                auth_method="cli",
                team_id=team,
                resource=f"team:{team}/{doc_type}:{doc_id}/revision:{row.version}->{target}",
                doc_ids=[doc_id],
                path="batch_ingest.revisions",
            )
        ]
    )
    return sources.set_version(key, to)


def main(argv: list[str] | None = None) -> int:
    settings = BatchSettings()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("show", "reset"))
    p.add_argument("--team", required=True)
    p.add_argument("--doc-id", required=True)
    p.add_argument("--doc-type", default="doc", help="doc (default), chat or file")
    p.add_argument("--to", type=int, default=None, help="the revision to record (default none)")
    p.add_argument("--operator", default=None, help="who resets (default: the login name)")
    p.add_argument("--reason", default="", help="why (required for reset; audited)")
    p.add_argument("--state-url", default=settings.state.url)
    p.add_argument("--audit-url", default=settings.audit.url)
    args = p.parse_args(argv)
    key: Key = (args.team, args.doc_type, args.doc_id)
    sources = SourceStore(args.state_url)
    try:
        row = sources.get(key)
        where = f"{args.doc_type}:{args.doc_id}"
        if row is None:
            print(f"no document {where} in team {args.team!r}", file=sys.stderr)
            return 2
        if args.command == "show":
            state = "deleted" if row.deleted else "indexed"
            print(f"{where}\trevision {row.version}\t{state}\t{row.updated_at}")
            return 0
        operator = args.operator or getpass.getuser()
        audit = None
        try:
            audit = AuditStore(args.audit_url, settings.audit.table)
            old = reset(sources, audit, key, operator=operator, reason=args.reason, to=args.to)
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        except Exception as exc:  # noqa: BLE001 (said, exit 1; nothing reset without its record)
            print(f"not reset: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            if audit is not None:
                audit.dispose()
        print(f"{where}: revision {old} -> {args.to}; audited as {ACTION}")
        return 0
    finally:
        sources.close()


if __name__ == "__main__":
    raise SystemExit(main())
