"""A bulk import's input: a JSON-lines file, a Parquet file, or a folder of both (its
``*.jsonl`` and ``*.parquet`` files, by name). Every row is validated as a ``SourceDocument``
of the job's team before anything is written: the first bad row stops the job, naming its
file, line (or row) and field.

A row without ``team_id`` is given the job's team; a row naming another team is refused, so a
job writes one team only. A Parquet null is an absent field (the column's default), a
timestamp column an ISO-8601 date-time. A document (``doc_type``, ``doc_id``) may appear once
per input: twice, the second is refused (which one wins would depend on the actors' order).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from batch_ingest.documents import Identifier, SourceDocument

logger = logging.getLogger("batch_ingest.bulk")

SUFFIXES = (".jsonl", ".parquet")
# The names a row may give its team by (``SourceDocument.team_id``'s aliases).
TEAM_KEYS = ("team_id", "dao_id", "microdao_id")
# Validation problems named per bad row, at most.
MAX_PROBLEMS = 5
PARQUET_BATCH_ROWS = 1024


class InputError(ValueError):
    """An input that cannot be imported as it is: the message names the file, the line or
    row, and the field. Raised before anything is written (the command exits 2)."""


@dataclass(frozen=True)
class Row:
    """One document of the input, its file, and where in it: ``docs.jsonl:12``,
    ``docs.parquet row 3``."""

    file: str
    where: str
    doc: SourceDocument

    @property
    def key(self) -> tuple[str, str]:
        return self.doc.doc_type, self.doc.doc_id


def input_files(path: Path) -> list[Path]:
    """The files of ``path``: itself, or a folder's ``*.jsonl`` and ``*.parquet`` files
    sorted by name (not its subfolders; hidden files are left out).

    Raises:
        InputError: no such file or folder, a file of another kind, an empty folder.
    """
    if path.is_dir():
        files = sorted(
            p
            for p in path.iterdir()
            if p.suffix in SUFFIXES and p.is_file() and not p.name.startswith(".")
        )
        if not files:
            raise InputError(f"{path}: holds no *.jsonl or *.parquet file")
        return files
    if not path.is_file():
        raise InputError(f"{path}: no such file or folder")
    if path.suffix not in SUFFIXES:
        raise InputError(f"{path}: not a .jsonl or .parquet file (or a folder of them)")
    return [path]


def check_team(team: str) -> str:
    """``team`` if it is a team id as ``SourceDocument`` takes one.

    Raises:
        InputError: an empty or malformed ``--team``."""
    try:
        value = TypeAdapter(Identifier).validate_python(team)
    except ValidationError as exc:
        raise InputError(f"--team {team!r}: {exc.errors()[0]['msg']}") from exc
    if value != team:
        raise InputError(f"--team {team!r}: leading or trailing whitespace")
    return team


def read_documents(path: Path, team: str) -> list[Row]:
    """Every document of ``path`` (``input_files``), validated, in file and line order.

    Raises:
        InputError: naming the first row that is not a document of ``team``.
    """
    check_team(team)
    rows: list[Row] = []
    seen: dict[tuple[str, str], str] = {}
    for file in input_files(path):
        reader = _parquet_rows if file.suffix == ".parquet" else _jsonl_rows
        for where, raw in reader(file):
            row = Row(str(file), where, to_document(raw, team, where))
            first = seen.setdefault(row.key, where)
            if first != where:
                raise InputError(
                    f"{where}: document {row.doc.doc_type}:{row.doc.doc_id} is also at {first}; "
                    "each document may appear once in a bulk import"
                )
            rows.append(row)
    return rows


def to_document(raw: Any, team: str, where: str) -> SourceDocument:
    """``raw`` as a document of ``team`` (its ``team_id`` given when absent).

    Raises:
        InputError: not an object, a field invalid, or another team named.
    """
    if not isinstance(raw, dict):
        raise InputError(f"{where}: not a JSON object but {type(raw).__name__}")
    if not any(k in raw for k in TEAM_KEYS):
        raw = {**raw, "team_id": team}
    try:
        doc = SourceDocument.model_validate(raw)
    except ValidationError as exc:
        raise InputError(f"{where}: {describe(exc)}") from exc
    if doc.team_id != team:
        raise InputError(
            f"{where}: field team_id: {doc.team_id!r} is not the job's team {team!r}; a bulk "
            "import writes the team of --team only (leave team_id out, or split the input)"
        )
    return doc


def describe(exc: ValidationError) -> str:
    """The fields a row got wrong: ``field text: text is empty; field acl.x: ...``."""
    problems = [
        f"field {'.'.join(str(p) for p in e['loc']) or '(the document)'}: {e['msg']}"
        for e in exc.errors()[:MAX_PROBLEMS]
    ]
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    number = 0
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):  # noqa: B007 (named on an error)
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{where}: not JSON: {exc}") from exc
                yield where, raw
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}:{number + 1}: not UTF-8: {exc}") from exc


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        batches = table.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        number = 0
        for batch in batches:
            for raw in batch.to_pylist():
                number += 1
                yield f"{path} row {number}", _from_parquet(raw)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file: {exc}") from exc


def _from_parquet(value: Any) -> Any:
    """A Parquet row as the JSON a line would hold: nulls left out, dates in ISO-8601."""
    if isinstance(value, dict):
        return {k: _from_parquet(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_from_parquet(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value
