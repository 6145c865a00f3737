"""Re-importing a 1,000-note vault after 10 changes, through a running gateway (issue 35).

    python -m bench.bench_vault_sync --url http://127.0.0.1:8000 [--token T] [--notes 1000]

Builds a vault of real text (the KJV, ``--verses`` consecutive verses per note, one folder per
book, ``hr/`` limited to group ``hr`` by its ``_access.yaml``) in a temporary folder and imports
it with ``python -m serve_app.cli.vault`` (in this process, over HTTP). Then 10 changes: 4 notes
edited, 2 deleted, 2 moved (one into ``hr/``), 2 added; and the vault is imported again. The
gateway's answers are recorded: chunks embedded, documents indexed, unchanged and removed, and
the wall time of each import. A third import with no change is the floor. Writes
``bench/results/vault_sync-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.common import environment_info, setup_logging, write_result
from bench.realtext import kjv_documents
from serve_app.cli.vault import main as vault_main


class Recording(httpx.Client):
    """An httpx client that sums what the gateway says it did."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reset()

    def reset(self) -> None:
        self.counts = {"embedded_chunks": 0, "indexed": 0, "unchanged": 0, "removed": 0}
        self.requests = 0

    def post(self, url: str, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        r = super().post(url, **kwargs)
        self.requests += 1
        if r.status_code == 200 and url == "/ingest/documents":
            body = r.json()
            self.counts["indexed"] += body["indexed"]
            self.counts["unchanged"] += body["unchanged"]
            self.counts["embedded_chunks"] += sum(d["embedded_chunks"] for d in body["documents"])
        elif r.status_code == 200 and url == "/ingest/sync":
            self.counts["removed"] += r.json()["removed"]
        return r


def build_vault(root: Path, notes: int, verses: int) -> list[Path]:
    docs = kjv_documents("x", limit=notes * verses)
    paths = []
    for i in range(notes):
        group = docs[i * verses : (i + 1) * verses]
        book = group[0]["title"].rsplit(" ", 1)[0].replace(" ", "_")
        folder = "hr" if i % 10 == 0 else book
        path = root / folder / f"note-{i:04d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = " ".join(v["text"] for v in group)
        path.write_text(f"# {group[0]['title']}\n\n{text}\n", encoding="utf-8")
        paths.append(path)
    (root / "hr" / "_access.yaml").write_text("acl:\n  allowed_groups: [hr]\n", encoding="utf-8")
    return paths


def change(root: Path, paths: list[Path]) -> list[str]:
    """Ten changes: 4 edits, 2 deletes, 2 moves (one into hr/), 2 additions."""
    done = []
    for p in paths[1:5]:
        p.write_text(p.read_text(encoding="utf-8") + "\nAn added line of commentary.\n")
        done.append(f"edited {p.relative_to(root)}")
    for p in paths[5:7]:
        p.unlink()
        done.append(f"deleted {p.relative_to(root)}")
    for p, folder in ((paths[7], "hr"), (paths[8], "moved")):
        target = root / folder / p.name
        target.parent.mkdir(parents=True, exist_ok=True)
        p.rename(target)
        done.append(f"moved {p.relative_to(root)} to {target.relative_to(root)}")
    for k in range(2):
        new = root / "added" / f"new-{k}.md"
        new.parent.mkdir(parents=True, exist_ok=True)
        new.write_text(f"# Added {k}\n\nA new note about the harvest, number {k}.\n")
        done.append(f"added {new.relative_to(root)}")
    return done


def import_once(client: Recording, root: Path, team: str, token: str) -> dict[str, Any]:
    client.reset()
    argv = [str(root), "--team", team]
    if token:
        argv += ["--token", token]
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = vault_main(argv, client=client)
    took = time.perf_counter() - started
    return {"rc": rc, "s": round(took, 2), "requests": client.requests, **client.counts,
            "summary": out.getvalue().strip().splitlines()[-1:]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--token", default="")
    p.add_argument("--team", default=None, help="default: a fresh bench_vault_<hex>")
    p.add_argument("--notes", type=int, default=1000)
    p.add_argument("--verses", type=int, default=10, help="verses per note")
    args = p.parse_args(argv)
    setup_logging()
    team = args.team or f"bench_vault_{uuid.uuid4().hex[:6]}"
    root = Path(tempfile.mkdtemp(prefix="bench_vault_")) / "vault"
    result: dict[str, Any] = {"team": team, "notes": args.notes, "verses_per_note": args.verses,
                              "environment": environment_info()}  # fmt: skip
    try:
        paths = build_vault(root, args.notes, args.verses)
        with Recording(base_url=args.url, timeout=600) as client:
            result["first_import"] = import_once(client, root, team, args.token)
            print("first import:", result["first_import"])
            result["changes"] = change(root, paths)
            result["reimport_10_changes"] = import_once(client, root, team, args.token)
            print("re-import after 10 changes:", result["reimport_10_changes"])
            result["reimport_no_change"] = import_once(client, root, team, args.token)
            print("re-import, nothing changed:", result["reimport_no_change"])
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    path = write_result("vault_sync", result)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
