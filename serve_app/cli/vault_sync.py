"""The vault importer's sync step: ``POST /ingest/sync`` with every note the vault still has,
so the gateway removes the documents of this vault (its source id) that it no longer has:
deleted notes, the old path of a moved note, a note now skipped. It runs before the notes are
sent, so a note moved into a restricted folder is never readable at its old, open path
meanwhile (at worst it is absent for the seconds of the import)."""

from __future__ import annotations

import logging
from typing import Any

import httpx

from batch_ingest.documents import SourceDocument

logger = logging.getLogger("serve_app.cli.vault")


def prune(
    client: Any,
    team_id: str,
    source_id: str,
    docs: list[SourceDocument],
    *,
    token: str = "",
    dry_run: bool = False,
) -> dict[str, Any]:
    """The gateway's ``IngestSyncResponse`` as a dict.

    Raises:
        RuntimeError: the gateway refused or could not be reached (the message says which).
    """
    headers = {"authorization": f"Bearer {token}"} if token else {}
    body = {
        "team_id": team_id,
        "source_id": source_id,
        "keep": [{"doc_type": d.doc_type, "doc_id": d.doc_id} for d in docs],
        "dry_run": dry_run,
    }
    try:
        r = client.post("/ingest/sync", json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"the gateway could not be reached: {exc}") from exc
    if r.status_code == 404:
        raise RuntimeError(
            "this gateway has no POST /ingest/sync (an older version): upgrade it, or import "
            "with --no-prune (documents the vault no longer has then stay searchable)"
        )
    if r.status_code != 200:
        raise RuntimeError(f"sync refused: HTTP {r.status_code} {r.text[:2000]}")
    result: dict[str, Any] = r.json()
    for d in result.get("documents", []):
        if d.get("status") == "failed":
            logger.error("removing %s failed: %s", d.get("doc_id"), d.get("error"))
    return result
