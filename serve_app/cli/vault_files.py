"""A vault's files, read without leaving the vault (issue 35).

No symbolic link is followed: a linked note or folder is left out and reported (git carries
symlinks, and a link's text would otherwise come from wherever it points while its rules came
from where the link sits). A note whose target is inside the vault is imported anyway, at its
own path and under its own folder's rules. Files that are not regular files (FIFOs, devices,
sockets) are left out too. Files are opened with ``O_NOFOLLOW`` and checked to be regular
after opening, so a file swapped for a link between the walk and the read is refused as well.

Each import is a sync of the vault into its team, so the vault has a stable source id: the
``--source-id`` given, else the one in the vault's ``.rag-vault-id`` file (written on the
first import; commit it with the vault so every clone prunes the same documents).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from batch_ingest.documents import SOURCE_ID_PATTERN

ACCESS_FILE = "_access.yaml"
# Names one could mean ``_access.yaml`` by; the importer reads only that one, so any of these
# stops the import instead of leaving the folder open.
NEAR_MISS = re.compile(r"[._]?access\.ya?ml(?:\.txt)?", re.I)
SOURCE_ID_FILE = ".rag-vault-id"


class VaultFileError(ValueError):
    """A file the importer must not or cannot read as it is (the message names it)."""


@dataclass
class VaultFiles:
    """The regular files of a vault outside hidden folders, and what was left out."""

    files: list[Path] = field(default_factory=list)
    # (path relative to the vault, reason): links, folders behind links, special files.
    refused: list[tuple[str, str]] = field(default_factory=list)


def _link_note(root: Path, path: Path) -> str:
    """Why a link is left out, saying whether its target is inside the vault."""
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return "symbolic link (not followed): its target does not exist"
    inside = target == root or root in target.parents
    where = (
        f"inside the vault ({target.relative_to(root).as_posix()}, imported at its own path "
        "if it is a note there)"
        if inside
        else "outside the vault"
    )
    return f"symbolic link (not followed): its target is {where}"


def walk_vault(root: Path) -> VaultFiles:
    """Every regular file below ``root`` outside hidden folders, in a stable order, and the
    links and special files left out."""
    root = Path(root).resolve()
    out = VaultFiles()
    for folder, dirs, files in os.walk(root):  # followlinks=False: linked folders not entered
        here = Path(folder)
        kept = []
        for d in sorted(dirs):
            if d.startswith("."):
                continue
            if (here / d).is_symlink():
                rel = (here / d).relative_to(root).as_posix()
                out.refused.append((rel + "/", _link_note(root, here / d)))
                continue
            kept.append(d)
        dirs[:] = kept
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = here / name
            rel = path.relative_to(root).as_posix()
            try:
                mode = path.lstat().st_mode
            except OSError as exc:
                out.refused.append((rel, f"cannot be read: {exc}"))
                continue
            if stat.S_ISLNK(mode):
                out.refused.append((rel, _link_note(root, path)))
            elif not stat.S_ISREG(mode):
                out.refused.append((rel, "not a regular file"))
            else:
                out.files.append(path)
    return out


def read_text(path: Path) -> str:
    """A regular file's text as UTF-8, never through a link.

    Raises:
        OSError: it cannot be opened (a link, gone) or is not a regular file.
        UnicodeDecodeError: it is not UTF-8.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path}: not a regular file")
        return f.read().decode("utf-8")


def source_id(root: Path, given: str | None = None, *, create: bool = True) -> str:
    """The vault's source id: ``given``, else its ``.rag-vault-id``, else a new one written
    there (``create``; otherwise ``""``).

    Raises:
        VaultFileError: an id that is not one (letters, digits, ``._:-``, at most 128).
    """
    path = Path(root) / SOURCE_ID_FILE
    value = given
    if value is None and path.is_file() and not path.is_symlink():
        value = read_text(path).strip()
    if value is None:
        if not create:
            return ""
        value = f"vault-{secrets.token_hex(8)}"
        path.write_text(value + "\n", encoding="utf-8")
    if not value or not re.fullmatch(SOURCE_ID_PATTERN, value):
        raise VaultFileError(
            f"source id {value!r} ({'--source-id' if given is not None else path}): use "
            "letters, digits and . _ : -, starting with a letter or digit, at most 128"
        )
    return value
