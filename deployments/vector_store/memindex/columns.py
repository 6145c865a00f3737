"""``FilterColumns``: the columns of a ``TeamIndex`` that filter terms read, and the row mask
of a filter's terms built from them.

Each key field (the string columns and ``doc_id``) is a column of integer codes, one per slot,
with the values seen so far and their codes beside it; ``created_at`` is a column of its own;
an array field (``tags``, the ACL tokens) is token -> slots, except the ACL's open token, which
nearly every row holds: a boolean column. A term's mask is then one comparison (or ``isin``)
over a column, or the slots its tokens hold. ``TeamIndex`` owns the slots (which are alive, how
many are used) and caches the masks; it grows, fills, clears and renumbers these columns with
its slots, under its lock (this class is not thread-safe).
"""

from __future__ import annotations

import numpy as np

from deployments.acl import OPEN
from deployments.protocols import ChunkRecord
from deployments.vector_store.filter import ARRAY_FIELDS, KEY_FIELDS, FilterTerm


class FilterColumns:
    """What the filter terms of one ``TeamIndex`` read, per slot."""

    def __init__(self) -> None:
        self._created = np.zeros(0, dtype=np.int64)
        self._codes = {f: np.zeros(0, dtype=np.int32) for f in KEY_FIELDS}
        self._values: dict[str, dict[str, int]] = {f: {} for f in KEY_FIELDS}
        # Array columns as token -> slots; the ACL's open token is the column ``_open``
        # (nearly every row holds it).
        self._arrays: dict[str, dict[str, set[int]]] = {f: {} for f in ARRAY_FIELDS}
        self._open = np.zeros(0, dtype=bool)

    @property
    def nbytes(self) -> int:
        """The per-slot columns' bytes (``TeamIndex.nbytes`` counts them)."""
        codes = sum(a.nbytes for a in self._codes.values())
        return int(codes + self._created.nbytes + self._open.nbytes)

    def grow(self, by: int) -> None:
        """``by`` more slots, empty (the index grows its own arrays beside)."""
        self._created = np.concatenate([self._created, np.zeros(by, np.int64)])
        self._open = np.concatenate([self._open, np.zeros(by, bool)])
        for name, codes in self._codes.items():
            self._codes[name] = np.concatenate([codes, np.full(by, -1, np.int32)])

    def add(self, slot: int, chunk: ChunkRecord) -> None:
        """``chunk``'s values in the new ``slot``."""
        self._created[slot] = int(chunk.created_at)
        for name in KEY_FIELDS:
            values = self._values[name]
            value = getattr(chunk, name)
            code = values.get(value)
            if code is None:
                code = values[value] = len(values)
            self._codes[name][slot] = code
        for name, tokens in _tokens(chunk):
            column = self._arrays[name]
            for token in tokens:
                column.setdefault(token, set()).add(slot)
        self._open[slot] = OPEN in chunk.acl_allow

    def discard(self, slot: int, record: ChunkRecord) -> None:
        """Take ``slot`` (which held ``record``) out of the token columns; the index marks it
        dead, so the code columns keep what it held."""
        for name, tokens in _tokens(record):
            column = self._arrays[name]
            for token in tokens:
                column[token].discard(slot)
        self._open[slot] = False

    def renumber(self, live: np.ndarray, renumber: dict[int, int]) -> None:
        """Keep the ``live`` slots only, numbered as ``renumber`` says (a repack)."""
        self._created = self._created[live].copy()
        self._codes = {name: codes[live].copy() for name, codes in self._codes.items()}
        self._open = self._open[live].copy()
        self._arrays = {
            name: {t: {renumber[s] for s in slots} for t, slots in column.items() if slots}
            for name, column in self._arrays.items()
        }

    def mask(self, terms: tuple[FilterTerm, ...], alive: np.ndarray, n: int) -> np.ndarray:
        """The rows of the first ``n`` slots that are ``alive`` and pass every term."""
        mask = alive[:n].copy()
        for term in terms:
            mask &= self._term_mask(term, n)
        return mask

    def _term_mask(self, term: FilterTerm, n: int) -> np.ndarray:
        value = term.value
        if isinstance(value, int):  # created_at bounds
            created = self._created[:n]
            return created >= value if term.op == "ge" else created <= value
        wanted = value if isinstance(value, tuple) else (value,)
        if term.field in ARRAY_FIELDS:
            return self._array_mask(term.field, term.op, wanted, n)
        known = self._values[term.field]
        codes = [known[v] for v in wanted if v in known]
        column = self._codes[term.field][:n]
        if not codes:
            return np.zeros(n, dtype=bool)
        return column == codes[0] if len(codes) == 1 else np.isin(column, codes)

    def _array_mask(self, name: str, op: str, wanted: tuple[str, ...], n: int) -> np.ndarray:
        column = self._arrays[name]
        sets = [column.get(t, set()) for t in wanted if not (name == "acl_allow" and t == OPEN)]
        if op == "all":
            slots = set.intersection(*sets) if sets else set()
        else:
            slots = set.union(*sets) if sets else set()
        mask = np.zeros(n, dtype=bool)
        if slots:
            mask[np.fromiter(slots, dtype=np.int64, count=len(slots))] = True
        if name == "acl_allow" and OPEN in wanted:
            mask |= self._open[:n]
        return ~mask if op == "none" else mask


def _tokens(chunk: ChunkRecord) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The array columns' tokens of ``chunk`` (the open token is a column of its own)."""
    allow = tuple(t for t in chunk.acl_allow if t != OPEN)
    return (("tags", chunk.tags), ("acl_allow", allow), ("acl_deny", chunk.acl_deny))
