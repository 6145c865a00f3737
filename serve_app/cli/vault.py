"""Import a Markdown (Obsidian-style) vault into a running gateway over HTTP.

    python -m serve_app.cli.vault vault/ --team dao_greenfood --dry-run
    python -m serve_app.cli.vault vault/ --team dao_greenfood --token "$TOKEN" \\
        --policy-out policy.yaml
    python -m serve_app.cli.vault vault/ --team dao_greenfood --export vault.jsonl

Every ``*.md`` note (hidden folders such as ``.obsidian`` and ``.git`` are skipped) becomes
one ``wiki`` document: ``doc_id`` is its path inside the vault, notes under
``projects/<name>/`` belong to project ``<name>``, notes under ``shared/skills/<SKILL-id>/``
carry the tag ``skill:<SKILL-id>``; front matter gives ``title``, ``tags``, ``created``/
``date`` and ``visibility``. The gateway extracts the ``[[wiki-links]]`` itself and writes them
to the graph. ``projects/<name>/_access.yaml`` and ``shared/skills/<id>/_access.yaml`` are
validated as resource policies of the gateway (docs/auth.md) and,
with ``--policy-out``, written (merged) into a policy file for ``AUTH__POLICY_FILE``. A bad
``_access.yaml`` stops the import before anything is sent (exit status 2); a bad note is
reported and skipped (exit 1 unless ``--allow-skipped``). Each run is a sync: the gateway first
removes the documents of this vault (its source id, ``.rag-vault-id``) that the vault no
longer has (``serve_app/cli/vault_sync.py``; ``--no-prune`` appends only). No symbolic link
is followed (``serve_app/cli/vault_files.py``). Re-running is safe (ingestion is idempotent).
``--export FILE.jsonl`` sends nothing: it writes the documents a run would send as JSON lines,
for the bulk import on Ray Data (``python -m batch_ingest.bulk FILE.jsonl --team T``), which
adds and updates but removes nothing (a sync over HTTP removes the notes a vault lost).

Document ACLs: an ``_access.yaml`` in any folder (the vault root's too) may carry an ``acl:``
mapping (``allowed_groups``, ``allowed_users``, ``denied_groups``) for every note in that folder
and below. The nearest folder with an ``acl`` wins outright: ACLs of folders further up are not
merged into it, and an empty ``acl: {}`` re-opens a subtree. A note's own front matter ``acl:``
replaces the folders' the same way. In ``projects/<name>/`` and ``shared/skills/<id>/`` the
``acl`` key is taken out before the rest is validated as the resource policy (a file with
nothing but ``acl`` and the folder's own ``project``/``skill``/``team_id`` declares no policy);
elsewhere an ``_access.yaml`` may hold nothing but ``acl``. A bad ``acl`` in an ``_access.yaml``
stops the import; in front matter it skips the note.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from batch_ingest.documents import DocumentAcl, SourceDocument, parse_timestamp
from batch_ingest.wikilinks import extract_links, wiki_key
from deployments.errors import InvalidInput
from deployments.protocols import MAX_TITLE
from serve_app.access.policy import DEFAULT_POLICY_FILE, SKILL_TAG_PREFIX, Policy, ResourcePolicy
from serve_app.cli.vault_files import (
    ACCESS_FILE,
    NEAR_MISS,
    SOURCE_ID_FILE,
    VaultFileError,
    read_text,
    source_id,
    walk_vault,
)
from serve_app.cli.vault_sync import prune

logger = logging.getLogger("serve_app.cli.vault")

ACL_KEY = "acl"
DOC_TYPE = "wiki"
VISIBILITIES = ("public", "confidential")
_ID_KEYS = ("id", "project", "skill", "name")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S | re.M)
_HEADING = re.compile(r"^#[ \t]+(.+?)[ \t#]*$", re.M)
# What an ``acl`` may name (docs/auth.md, "Vault document ACLs"): a group or user id of
# letters, digits and ``. _ @ : + -``, starting with a letter or digit.
ACL_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}")


class AccessFileError(InvalidInput, ValueError):
    """A ``_access.yaml`` that is not a valid resource policy (the message names the file)."""


class AclError(ValueError):
    """An ``acl`` mapping that is not a document ACL; ``problems`` are (field, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{name}: {message}" for name, message in problems))


@dataclass
class VaultPlan:
    """What one vault holds: the documents to send and the resource policies it declares."""

    team_id: str
    # The vault's source id (serve_app/cli/vault_files.py): every document carries it.
    source_id: str = ""
    documents: list[SourceDocument] = field(default_factory=list)
    # doc_id -> wiki-link keys of its text (what the gateway will write as LINKS_TO).
    links: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (path relative to the vault, reason) of every note left out.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    projects: list[ResourcePolicy] = field(default_factory=list)
    skills: list[ResourcePolicy] = field(default_factory=list)
    # folder relative to the vault ("" = its root) -> the acl of its _access.yaml.
    acls: dict[str, DocumentAcl] = field(default_factory=dict)

    @property
    def acl_count(self) -> int:
        """Notes that carry a document ACL (from their folder or their front matter)."""
        return sum(1 for doc in self.documents if doc.acl is not None)

    @property
    def link_count(self) -> int:
        return sum(len(keys) for keys in self.links.values())

    def resolved_link_count(self) -> int:
        """Links whose target is a note of this vault (by file name or title)."""
        known = set()
        for doc in self.documents:
            known.add(wiki_key(doc.doc_id))
            if doc.title:
                known.add(wiki_key(doc.title))
        return sum(1 for keys in self.links.values() for key in keys if key in known)

    def per_project(self) -> Counter[str]:
        return Counter(d.project_id for d in self.documents if d.project_id)

    def per_skill(self) -> Counter[str]:
        return Counter(
            t[len(SKILL_TAG_PREFIX) :]
            for d in self.documents
            for t in d.tags
            if t.startswith(SKILL_TAG_PREFIX)
        )


# --- reading -------------------------------------------------------------------------------


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """``(front matter, body)``; raise ``ValueError`` when the front matter is not a mapping."""
    text = text.lstrip("\ufeff")
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise ValueError(f"front matter is not YAML: {exc}") from exc
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ValueError("front matter is not a mapping")
    return meta, text[match.end() :]


def _timestamp(value: Any) -> int | None:
    """Epoch seconds of a front-matter date, or None when it is missing or unparseable."""
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(value.timestamp())
    if isinstance(value, date):
        return int(datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp())
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return parse_timestamp(value) or None
    except ValueError:
        return None


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        items = [items]
    tags = [str(t).strip().lstrip("#").strip() for t in items if t is not None]
    return [t for t in tags if t]


def parse_acl(value: Any) -> DocumentAcl:
    """An ``acl:`` mapping (front matter or ``_access.yaml``) as a document ACL.

    Raises:
        AclError: naming each field (``acl.allowed_groups.0``) that is wrong.
    """
    if not isinstance(value, dict):
        keys = ", ".join(DocumentAcl.model_fields)
        raise AclError([(ACL_KEY, f"expected a mapping of {keys}, got {type(value).__name__}")])
    try:
        acl = DocumentAcl.model_validate(value)
    except ValidationError as exc:
        raise AclError(
            [(".".join([ACL_KEY, *(str(p) for p in e["loc"])]), e["msg"]) for e in exc.errors()]
        ) from exc
    bad = [
        (f"{ACL_KEY}.{name}.{i}", f"{entry!r} is not an identifier (letters, digits and "
         ". _ @ : + -, starting with a letter or digit, at most 128)")
        for name in ("allowed_groups", "allowed_users", "denied_groups")
        for i, entry in enumerate(value.get(name) or [])
        if not (isinstance(entry, str) and ACL_IDENTIFIER.fullmatch(entry.strip()))
    ]  # fmt: skip
    if bad:
        raise AclError(bad)
    return acl


def folder_acl(acls: dict[str, DocumentAcl], rel: str) -> DocumentAcl | None:
    """The ``acl`` of the nearest folder above the note ``rel`` that declares one, if any."""
    folder = rel.rpartition("/")[0]
    while folder not in acls:
        if not folder:
            return None
        folder = folder.rpartition("/")[0]
    return acls[folder]


def _note_acl(meta: dict[str, Any], inherited: DocumentAcl | None) -> DocumentAcl | None:
    """The front matter's ``acl`` if it has one, else the folder's; None when it is empty."""
    acl = parse_acl(meta[ACL_KEY]) if ACL_KEY in meta else inherited
    return acl if acl is not None and acl.restricts else None


def _title(meta: dict[str, Any], body: str, stem: str) -> str:
    title = meta.get("title")
    if title is not None and str(title).strip():
        return str(title).strip()[:MAX_TITLE]
    heading = _HEADING.search(body)
    if heading:
        return heading.group(1).strip()[:MAX_TITLE]
    return stem[:MAX_TITLE]


def read_note(
    root: Path,
    path: Path,
    team_id: str,
    visibility: str = "public",
    inherited_acl: DocumentAcl | None = None,
    source_id: str = "",
) -> SourceDocument:
    """One note as a document; raise ``ValueError`` (or ``OSError``) saying why it is invalid.

    ``inherited_acl`` is its folder's (``folder_acl``); front matter ``acl`` replaces it."""
    rel = path.relative_to(root).as_posix()
    parts = rel.split("/")
    raw = read_text(path)
    meta, body = split_front_matter(raw)
    tags: list[str] = []
    project_id = ""
    if len(parts) >= 3 and parts[0] == "projects":
        project_id = parts[1]
    if len(parts) >= 4 and parts[0] == "shared" and parts[1] == "skills":
        tags.append(SKILL_TAG_PREFIX + parts[2])
    tags += _tags(meta.get("tags"))
    created = _timestamp(meta.get("created"))
    if created is None:
        created = _timestamp(meta.get("date"))
    if created is None:
        created = int(path.stat().st_mtime)
    chosen = meta.get("visibility")
    if chosen not in VISIBILITIES:
        if chosen is not None:
            logger.warning("%s: visibility %r is not public/confidential; using %s", rel,
                           chosen, visibility)  # fmt: skip
        chosen = visibility
    acl = _note_acl(meta, inherited_acl)
    try:
        return SourceDocument(
            team_id=team_id,
            doc_id=rel,
            text=body,
            title=_title(meta, body, path.stem),
            project_id=project_id,
            visibility=chosen,
            doc_type=DOC_TYPE,
            tags=tags,
            created_at=created,
            acl=acl,
            source_id=source_id,
        )
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'note'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(reasons) from exc


def _load_access(path: Path) -> dict[str, Any]:
    """The fields of a ``_access.yaml``.

    Raises:
        AccessFileError: when it is unreadable (a link too) or not a mapping.
    """
    try:
        raw = yaml.safe_load(read_text(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AccessFileError(f"{path}: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise AccessFileError(f"{path}: expected a mapping of fields, got {type(raw).__name__}")
    return dict(raw)


def _pop_acl(path: Path, data: dict[str, Any]) -> DocumentAcl | None:
    """Take the ``acl`` out of ``data``; None when the file has none."""
    if ACL_KEY not in data:
        return None
    try:
        return parse_acl(data.pop(ACL_KEY))
    except AclError as exc:
        reasons = "; ".join(f"field {name!r}: {message}" for name, message in exc.problems)
        raise AccessFileError(f"{path}: {reasons}") from exc


def _pop_identity(path: Path, data: dict[str, Any], resource_id: str, team_id: str) -> None:
    """Take out the fields naming the resource and team, checking they name this folder."""
    for key in _ID_KEYS:
        if key in data:
            value = data.pop(key)
            if value is not None and str(value) != resource_id:
                raise AccessFileError(
                    f"{path}: field {key!r} is {value!r} but the folder is {resource_id!r}"
                )
    file_team = data.pop("team_id", None)
    if file_team is not None and str(file_team) != team_id:
        raise AccessFileError(f"{path}: field 'team_id' is {file_team!r}, importing {team_id!r}")


def _resource_policy(
    path: Path, data: dict[str, Any], resource_id: str, team_id: str
) -> ResourcePolicy:
    try:
        return ResourcePolicy.model_validate({**data, "id": resource_id, "team_id": team_id})
    except ValidationError as exc:
        reasons = "; ".join(
            f"field {'.'.join(str(p) for p in e['loc']) or '?'!r}: {e['msg']}" for e in exc.errors()
        )
        raise AccessFileError(f"{path}: {reasons}") from exc


def read_access_file(
    path: Path, resource_id: str | None, team_id: str
) -> tuple[DocumentAcl | None, ResourcePolicy | None]:
    """A ``_access.yaml`` as ``(its acl, its resource policy)``, either of them None.

    ``resource_id`` is the project or skill of the folder, or None for any other folder (whose
    file may hold only ``acl``). A project or skill file without ``acl`` is a policy, as it
    always was (an empty one too); one with ``acl`` is a policy only when it has other policy
    fields than the folder's ``project``/``skill``/``id``/``name`` and ``team_id``.

    Raises:
        AccessFileError: naming the file and the field that is wrong.
    """
    data = _load_access(path)
    has_acl = ACL_KEY in data
    acl = _pop_acl(path, data)
    if resource_id is None and not has_acl and not data:
        # Fail closed: outside projects and skills (where an empty file is a private
        # policy) a file that says nothing would leave the folder open.
        raise AccessFileError(
            f"{path}: grants nothing (empty, or only comments); write `acl: {{}}` to leave "
            "the folder open on purpose, or remove the file"
        )
    if resource_id is None:
        if data:
            keys = ", ".join(repr(str(k)) for k in data)
            raise AccessFileError(
                f"{path}: field {keys} not allowed; outside projects/<name>/ and "
                f"shared/skills/<id>/ an {ACCESS_FILE} may hold only {ACL_KEY!r}"
            )
        return acl, None
    _pop_identity(path, data, resource_id, team_id)
    if has_acl and not data:
        return acl, None
    return acl, _resource_policy(path, data, resource_id, team_id)


def read_access(path: Path, resource_id: str, team_id: str) -> ResourcePolicy | None:
    """A ``_access.yaml`` as the gateway's resource policy of ``resource_id`` in ``team_id``
    (None when the file only carries an ``acl``).

    Raises:
        AccessFileError: naming the file and the field that is wrong.
    """
    return read_access_file(path, resource_id, team_id)[1]


def add_access_file(plan: VaultPlan, root: Path, path: Path) -> None:
    """Record one ``_access.yaml``: its policy under its project or skill, its ``acl`` under
    its folder.

    Raises:
        AccessFileError: naming the file and the field that is wrong.
    """
    rel = path.relative_to(root).as_posix()
    parts = rel.split("/")
    policies: list[ResourcePolicy] | None = None
    resource_id: str | None = None
    if len(parts) == 3 and parts[0] == "projects":
        policies, resource_id = plan.projects, parts[1]
    elif len(parts) == 4 and parts[:2] == ["shared", "skills"]:
        policies, resource_id = plan.skills, parts[2]
    acl, policy = read_access_file(path, resource_id, plan.team_id)
    if policies is not None and policy is not None:
        policies.append(policy)
    if acl is not None:
        plan.acls[rel.rpartition("/")[0]] = acl
    elif policies is None:
        logger.warning("%s: no %r (and not projects/<name>/ or shared/skills/<id>/); ignored",
                       rel, ACL_KEY)  # fmt: skip


def scan_vault(
    root: Path, team_id: str, visibility: str = "public", source_id: str = ""
) -> VaultPlan:
    """Read every note and access file of the vault, never through a link.

    Raises:
        AccessFileError: for the first bad ``_access.yaml``, one behind a link, or a file
            named nearly so (nothing should be sent then).
    """
    root = Path(root).resolve()
    plan = VaultPlan(team_id=team_id, source_id=source_id)
    found = walk_vault(root)
    for rel, reason in found.refused:
        name = rel.rstrip("/").rpartition("/")[2]
        if NEAR_MISS.fullmatch(name):
            raise AccessFileError(f"{root / rel}: an access file that is a {reason}")
        plan.skipped.append((rel, reason))
    # Every access file first: a note's folder ACL may sort after it, and a bad file must
    # stop the import whatever notes come before it.
    for path in found.files:
        if path.name != ACCESS_FILE and NEAR_MISS.fullmatch(path.name):
            raise AccessFileError(
                f"{path}: named like an access file but only {ACCESS_FILE!r} is read; rename it"
                " (a rule the importer skipped would leave the folder open)"
            )
        if path.name == ACCESS_FILE:
            add_access_file(plan, root, path)
    for path in found.files:
        if path.name == ACCESS_FILE or path.suffix.lower() != ".md":
            continue
        rel = path.relative_to(root).as_posix()
        try:
            doc = read_note(root, path, team_id, visibility, folder_acl(plan.acls, rel), source_id)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            plan.skipped.append((rel, str(exc)))
            continue
        plan.documents.append(doc)
        plan.links[doc.doc_id] = extract_links(doc.text)
    return plan


# --- policy file ---------------------------------------------------------------------------


def _entry_key(entry: Any) -> tuple[str | None, str] | None:
    try:
        parsed = ResourcePolicy.model_validate(entry)
    except ValidationError:
        return None
    return parsed.team_id, parsed.id


def merge_policy(existing: dict[str, Any] | None, plan: VaultPlan) -> dict[str, Any]:
    """``existing`` (a policy file's YAML, or the packaged default when None) with the
    vault's project and skill policies: other keys and entries are kept, an entry with the
    same ``(team_id, id)`` is replaced."""
    if existing is None:
        existing = yaml.safe_load(DEFAULT_POLICY_FILE.read_text(encoding="utf-8")) or {}
    out = dict(existing)
    for kind, new in (("projects", plan.projects), ("skills", plan.skills)):
        keys = {(p.team_id, p.id) for p in new}
        kept = [e for e in (out.get(kind) or []) if _entry_key(e) not in keys]
        out[kind] = kept + [p.model_dump(exclude_none=True) for p in new]
    return out


def write_policy(path: Path, plan: VaultPlan) -> Policy:
    """Write (or merge into) the policy file ``path``; return it as the gateway will load it.

    Raises:
        ValueError: naming the file when the existing one or the result is not a policy.
    """
    existing = None
    if path.exists():
        try:
            existing = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"policy file {path}: {exc}") from exc
        if not isinstance(existing, dict):
            raise ValueError(f"policy file {path}: not a mapping")
    merged = merge_policy(existing, plan)
    try:
        Policy.model_validate(merged)
    except (ValidationError, ValueError) as exc:
        raise ValueError(f"policy file {path}: {exc}") from exc
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(merged, sort_keys=False, allow_unicode=True), "utf-8")
    tmp.replace(path)
    return Policy.load(path)


# --- sending -------------------------------------------------------------------------------


def _payload(doc: SourceDocument) -> dict[str, Any]:
    """A document as JSON; ``acl`` only when it has one (gateways before ACLs refuse it)."""
    return doc.model_dump(mode="json", exclude={ACL_KEY} if doc.acl is None else None)


def post_documents(
    client: httpx.Client, docs: list[SourceDocument], batch_size: int, token: str = ""
) -> dict[str, int] | None:
    """POST the documents in batches; the totals, or None when a batch was refused.

    ``client`` is any httpx-style client with a base URL (a FastAPI ``TestClient`` too)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    totals = {"indexed": 0, "unchanged": 0, "failed": 0}
    started = time.perf_counter()
    for start in range(0, len(docs), batch_size):
        batch = docs[start : start + batch_size]
        payload = {"documents": [_payload(d) for d in batch]}
        r = client.post("/ingest/documents", json=payload, headers=headers)
        if r.status_code != 200:
            logger.error("batch at document %d (%s) refused: HTTP %d %s", start + 1,
                         batch[0].doc_id, r.status_code, r.text[:2000])  # fmt: skip
            return None
        body = r.json()
        for key in totals:
            totals[key] += body[key]
        for result in body.get("documents", []):
            if result.get("status") == "failed":
                logger.error("%s failed: %s", result.get("doc_id"), result.get("error"))
        done = start + len(batch)
        rate = done / max(time.perf_counter() - started, 1e-9)
        logger.info("%d/%d documents (%.1f docs/s, ETA %.0fs)%s", done, len(docs), rate,
                    (len(docs) - done) / rate if rate else 0,
                    " degraded: " + "; ".join(body["degraded_reasons"]) if body.get("degraded")
                    else "")  # fmt: skip
    return totals


def export_documents(path: Path, docs: list[SourceDocument]) -> None:
    """The documents as JSON lines, as they would be sent (``python -m batch_ingest.bulk``
    reads them)."""
    with path.open("w", encoding="utf-8") as out:
        for doc in docs:
            out.write(json.dumps(_payload(doc), ensure_ascii=False) + "\n")


# --- CLI -----------------------------------------------------------------------------------


def _describe_acl(acl: DocumentAcl) -> str:
    fields = [(k, ",".join(v)) for k, v in acl.model_dump().items() if v]
    return "; ".join(f"{k}={v}" for k, v in fields) or "open (no restriction)"


def describe(plan: VaultPlan) -> list[str]:
    """The plan as lines: counts per project and skill, links, ACLs, policies, skipped notes."""
    lines = [
        f"vault plan for team {plan.team_id}: {len(plan.documents)} notes, "
        f"{len(plan.skipped)} skipped, {plan.link_count} wiki-links "
        f"({plan.resolved_link_count()} to notes of the vault)"
    ]
    for project, count in sorted(plan.per_project().items()):
        lines.append(f"  project {project}: {count} notes")
    for skill, count in sorted(plan.per_skill().items()):
        lines.append(f"  skill {skill}: {count} notes")
    other = sum(1 for d in plan.documents if not d.project_id and not any(
        t.startswith(SKILL_TAG_PREFIX) for t in d.tags))  # fmt: skip
    if other:
        lines.append(f"  outside projects and skills: {other} notes")
    lines.append(f"  notes with an ACL: {plan.acl_count}")
    for folder, acl in sorted(plan.acls.items()):
        lines.append(f"  acl {folder + '/' if folder else '(vault root)'}: {_describe_acl(acl)}")
    for kind, entries in (("project", plan.projects), ("skill", plan.skills)):
        for p in entries:
            extra = ", ".join(
                f"{k}={v}"
                for k, v in (
                    ("owner_group", p.owner_group),
                    ("allowed_groups", ",".join(p.allowed_groups)),
                    ("required_role", p.required_role),
                    ("required_permission", p.required_permission),
                )
                if v
            )
            lines.append(
                f"  policy {kind} {p.id}: {p.access_level}" + (f" ({extra})" * bool(extra))
            )
    for rel, reason in plan.skipped:
        lines.append(f"  skipped {rel}: {reason}")
    return lines


def main(argv: list[str] | None = None, client: httpx.Client | None = None) -> int:
    """Run the CLI; ``client`` replaces the HTTP client built from ``--url`` (tests)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("vault", type=Path, help="vault folder (the one holding projects/)")
    parser.add_argument("--team", required=True, help="team_id every note is indexed into")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    parser.add_argument("--token", default="", help="bearer token, if the gateway wants one")
    parser.add_argument("--policy-out", type=Path, help="write/merge the _access.yaml policies")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and what would be removed")  # fmt: skip
    parser.add_argument("--visibility", choices=VISIBILITIES, default="public",
                        help="visibility of notes whose front matter sets none")  # fmt: skip
    parser.add_argument("--batch-size", "--batch", type=int, default=32, dest="batch_size",
                        help="documents per request")  # fmt: skip
    parser.add_argument("--source-id", default=None,
                        help=f"this vault's id (default: {SOURCE_ID_FILE})")  # fmt: skip
    parser.add_argument("--no-prune", action="store_true",
                        help="append only: keep the documents of this vault that it no longer "
                        "has (deleted or moved notes stay searchable)")  # fmt: skip
    parser.add_argument("--allow-skipped", action="store_true",
                        help="exit 0 even when notes were skipped")  # fmt: skip
    parser.add_argument("--export", type=Path, metavar="FILE.jsonl",
                        help="send nothing: write the documents as JSON lines for "
                        "python -m batch_ingest.bulk (no removals)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.export is not None and args.dry_run:
        parser.error("--export and --dry-run exclude each other")
    if not args.vault.is_dir():
        parser.error(f"{args.vault} is not a folder")
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    try:
        source = source_id(args.vault, args.source_id, create=not args.dry_run)
        plan = scan_vault(args.vault, args.team, args.visibility, source)
    except (AccessFileError, VaultFileError) as exc:
        print(f"error: {exc}; nothing was sent", file=sys.stderr)
        return 2
    for rel, reason in plan.skipped:
        logger.warning("skipped %s: %s", rel, reason)
    if args.export is not None:
        return _export(args, plan)
    if client is None:
        with httpx.Client(base_url=args.url, timeout=300) as http:
            return _run(args, plan, http)
    return _run(args, plan, client)


def _run(args: argparse.Namespace, plan: VaultPlan, client: Any) -> int:
    skipped_rc = 0 if args.allow_skipped or not plan.skipped else 1
    if args.dry_run:
        print("\n".join(describe(plan)))
        print(_removal_plan(args, plan, client))
        if args.policy_out:
            print(f"dry run: would write {len(plan.projects)} project and {len(plan.skills)} "
                  f"skill policies to {args.policy_out}")  # fmt: skip
        return 0

    if args.policy_out:
        try:
            write_policy(args.policy_out, plan)
        except ValueError as exc:
            print(f"error: {exc}; nothing was sent", file=sys.stderr)
            return 2
        print(f"wrote {len(plan.projects)} project and {len(plan.skills)} skill policies to "
              f"{args.policy_out}; point the gateway at it with:\n"
              f"  AUTH__POLICY_FILE={args.policy_out.resolve()}")  # fmt: skip

    removed = 0
    if not args.no_prune:
        try:
            synced = prune(client, args.team, plan.source_id, plan.documents, token=args.token)
        except RuntimeError as exc:
            print(f"error: {exc}; nothing was sent", file=sys.stderr)
            return 1
        removed = synced["removed"]
        for d in synced["documents"]:
            if d["status"] == "deleted":
                logger.info("removed %s (no longer in the vault)", d["doc_id"])
        if synced["failed"]:
            print(f"error: {synced['failed']} removals failed; the notes were not sent",
                  file=sys.stderr)  # fmt: skip
            return 1
    if not plan.documents:
        print(f"no notes to send; removed {removed}")
        return 1 if plan.skipped and not args.allow_skipped else 0
    totals = post_documents(client, plan.documents, args.batch_size, args.token)
    if totals is None:
        return 1
    print(
        f"done: indexed {totals['indexed']}, unchanged {totals['unchanged']}, "
        f"failed {totals['failed']}, removed {removed}, skipped {len(plan.skipped)}; "
        f"{plan.link_count} wiki-links; {plan.acl_count} notes with an ACL; projects: "
        f"{', '.join(sorted(plan.per_project())) or '-'}; skills: "
        f"{', '.join(sorted(plan.per_skill())) or '-'}"
    )
    for rel, reason in plan.skipped:
        print(f"  skipped {rel}: {reason}")
    if plan.skipped and not args.allow_skipped:
        print(f"{len(plan.skipped)} notes skipped (exit 1; --allow-skipped accepts that)",
              file=sys.stderr)  # fmt: skip
    return 1 if totals["failed"] else skipped_rc


def _export(args: argparse.Namespace, plan: VaultPlan) -> int:
    """``--export``: the policies (with ``--policy-out``) and the documents, written locally."""
    try:
        if args.policy_out:
            write_policy(args.policy_out, plan)
        export_documents(args.export, plan.documents)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}; nothing was exported", file=sys.stderr)
        return 2
    print(f"exported {len(plan.documents)} notes to {args.export}, skipped "
          f"{len(plan.skipped)}; nothing was sent. Import them with:\n"
          f"  python -m batch_ingest.bulk {args.export} --team {args.team}")  # fmt: skip
    return 1 if plan.skipped and not args.allow_skipped else 0


def _removal_plan(args: argparse.Namespace, plan: VaultPlan, client: Any) -> str:
    """What a real run would remove, asked of the gateway (a dry-run sync)."""
    if args.no_prune:
        return "  removals: none (--no-prune)"
    if not plan.source_id:
        return f"  removals: none (first import: no {SOURCE_ID_FILE} yet)"
    try:
        synced = prune(
            client, args.team, plan.source_id, plan.documents, token=args.token, dry_run=True
        )
    except RuntimeError as exc:
        return f"  removals: unknown ({exc})"
    gone = [d["doc_id"] for d in synced["documents"]]
    present = {p["doc_id"] for p in synced.get("present", [])}
    new = sorted(d.doc_id for d in plan.documents if d.doc_id not in present)
    lines = [
        f"  would add {len(new)} notes the gateway does not have, send {len(present)} it has "
        "(re-embedded only where changed)",
        *(f"    + {doc_id}" for doc_id in new),
        f"  would remove {len(gone)} of the {synced['known']} documents of this vault "
        f"({plan.source_id}) the gateway has:",
        *(f"    - {doc_id}" for doc_id in gone),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
