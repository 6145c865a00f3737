"""The gateway writes the tenant scope into a caller's simple Cypher itself.

A caller's query the plan check (``deployments.graph_store.guard``) refuses as unscoped may be
simple enough to scope: ``scope_query`` adds ``v.team_id = $team_id`` (and, where the caller
may not see every visibility, ``v.visibility IN $visibilities``, for relationships too) for
every variable a MATCH / OPTIONAL MATCH clause binds, in that clause's WHERE, naming
anonymous nodes (and relationships) first. The result goes through EXPLAIN and
``check_plan`` like any caller query: the rewrite saves the caller typing the predicates, it
proves nothing.
"""

from __future__ import annotations

import re

from deployments.graph_store.guard import _NAME, _unquote

# Clause keywords: at the top level of a simple query only MATCH, OPTIONAL MATCH, WHERE and
# one final RETURN (with ORDER BY, SKIP/OFFSET and LIMIT) may appear.
_CLAUSE_WORDS = frozenset(
    {
        "MATCH",
        "OPTIONAL",
        "WHERE",
        "RETURN",
        "WITH",
        "UNWIND",
        "CALL",
        "UNION",
        "CREATE",
        "MERGE",
        "SET",
        "DELETE",
        "DETACH",
        "NODETACH",
        "REMOVE",
        "FOREACH",
        "LOAD",
        "USE",
        "USING",
        "FINISH",
        "ORDER",
        "SKIP",
        "OFFSET",
        "LIMIT",
        "INSERT",
        "FILTER",
        "LET",
        "NEXT",
        "SHOW",
        "TERMINATE",
        "YIELD",
        "CYPHER",
        "EXPLAIN",
        "PROFILE",
    }
)
_AFTER_RETURN = frozenset({"ORDER", "SKIP", "OFFSET", "LIMIT"})
_LEAD_NAME = re.compile(rf"^\s*(?P<var>{_NAME})")
_PATH_VAR = re.compile(rf"^\s*(?P<var>{_NAME})\s*=\s*")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SCOPE_PREFIX = "_g"


class _NotSimple(Exception):
    """The query is not one ``scope_query`` rewrites."""


def after_quoted(text: str, i: int) -> int:
    """The index after the string (``'...'``, ``"..."``) or backtick name starting at ``i``;
    an unclosed one is not simple."""
    quote, n = text[i], len(text)
    if quote == "`":
        j = text.find("`", i + 1)
        if j < 0:
            raise _NotSimple("unclosed name")
        return j + 1
    j = i + 1
    while j < n and text[j] != quote:
        j += 2 if text[j] == "\\" else 1
    if j >= n:
        raise _NotSimple("unclosed string")
    return j + 1


def _lex(text: str) -> tuple[list[tuple[int, int]], list[int]]:
    """``(words, depth0)``: the spans of the words outside every quote, backtick name and
    bracket that are not property keys or parameters (``n.limit``, ``$skip``), and the
    indexes of the characters outside every quote and bracket. Comments and unbalanced text
    raise ``_NotSimple``."""
    words: list[tuple[int, int]] = []
    top: list[int] = []
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`":
            i = after_quoted(text, i)
            continue
        if text.startswith(("//", "/*"), i):
            raise _NotSimple("comment")
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise _NotSimple("unbalanced")
        elif depth == 0:
            top.append(i)
            m = _WORD.match(text, i) if (ch.isalpha() or ch == "_") else None
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_$.")):
                words.append((i, m.end()))
                top.extend(range(i + 1, m.end()))
                i = m.end()
                continue
        i += 1
    if depth:
        raise _NotSimple("unbalanced")
    return words, top


def _split_at(text: str, top: list[int], sep: str) -> list[str]:
    parts, start = [], 0
    for i in top:
        if i >= start and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    parts.append(text[start:])
    return parts


def _element(text: str, pos: int, open_: str, close: str) -> tuple[str, int]:
    """The content of the bracketed element at ``pos`` and the index after it."""
    if not text.startswith(open_, pos):
        raise _NotSimple(f"expected {open_!r}")
    depth, i, n = 0, pos, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`":
            i = after_quoted(text, i)
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                if ch != close:
                    raise _NotSimple("mismatched bracket")
                return text[pos + 1 : i], i + 1
        i += 1
    raise _NotSimple("unbalanced")


def _content(inner: str, kind: str) -> tuple[str | None, str]:
    """``(variable or None, the rest)`` of a node or relationship pattern's content; a
    quantifier, an inline WHERE or a nested pattern is not simple."""
    inner = inner.strip()
    if inner.startswith("(") or re.search(r"(?i)\bwhere\b", inner):
        raise _NotSimple(f"{kind} pattern with a predicate or nested pattern")
    if kind == "relationship" and "*" in inner:
        raise _NotSimple("variable-length relationship")
    m = _LEAD_NAME.match(inner)
    if not m or m["var"].upper() == "IS":
        return None, inner
    return m["var"], inner[m.end() :].strip()


class _Scoper:
    def __init__(self, query: str, restrict_visibility: bool) -> None:
        self.restrict = restrict_visibility
        self.taken = set(_WORD.findall(query))
        self.bound: set[str] = set()
        self.counter = 0

    def fresh(self) -> str:
        while True:
            name = f"{SCOPE_PREFIX}{self.counter}"
            self.counter += 1
            if name not in self.taken:
                self.taken.add(name)
                return name

    def bind(self, var: str | None, kind: str, preds: list[str]) -> str | None:
        """Record the variable of one element; the name to write for an anonymous one (None:
        keep it anonymous). New variables get their predicates."""
        if var is None:
            if kind == "relationship" and not self.restrict:
                return None
            var = self.fresh()
            named = var
        else:
            named = None
        key = _unquote(var)
        if key in self.bound:
            return named
        self.bound.add(key)
        if kind == "node":
            preds.append(f"{var}.team_id = $team_id")
        if self.restrict:
            preds.append(f"{var}.visibility IN $visibilities")
        return named

    def path(self, text: str, preds: list[str]) -> str:
        """One path pattern with its anonymous elements named."""
        out = []
        m = _PATH_VAR.match(text)
        if m:
            self.bound.add(_unquote(m["var"]))
            out.append(f"{m['var']} = ")
            text = text[m.end() :]
        text = text.strip()
        pos = 0
        while True:
            inner, pos = _element(text, pos, "(", ")")
            var, rest = _content(inner, "node")
            named = self.bind(var, "node", preds)
            out.append(f"({named or var or ''}{rest})" if named else f"({inner.strip()})")
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos == len(text):
                return "".join(out)
            left = ""
            if text.startswith("<", pos):
                left, pos = "<", pos + 1
            if not text.startswith("-", pos):
                raise _NotSimple("expected a relationship")
            pos += 1
            rel: str | None = None
            if text.startswith("[", pos):
                rel, pos = _element(text, pos, "[", "]")
            if not text.startswith("-", pos):
                raise _NotSimple("expected a relationship")
            pos += 1
            right = ""
            if text.startswith(">", pos):
                right, pos = ">", pos + 1
            var, rest = _content(rel or "", "relationship")
            named = self.bind(var, "relationship", preds)
            if named:
                body = f"[{named}{rest}]"
            elif rel is not None:
                body = f"[{rel.strip()}]"
            else:
                body = ""
            out.append(f"{left}-{body}-{right}")
            while pos < len(text) and text[pos].isspace():
                pos += 1


def scope_query(query: str, *, restrict_visibility: bool) -> str | None:
    """``query`` with the scope predicates compiled in (see above), or ``None`` when it is not
    a simple read: MATCH / OPTIONAL MATCH clauses of fixed-length patterns, each with an
    optional WHERE, then one RETURN (no ``RETURN *``), nothing else at the top level, no
    comments."""
    try:
        return _scope_query(query, restrict_visibility)
    except _NotSimple:
        return None


def _scope_query(query: str, restrict_visibility: bool) -> str:
    text = query.strip().rstrip(";").strip()
    words, top = _lex(text)
    marks = [(s, e, text[s:e].upper()) for s, e in words if text[s:e].upper() in _CLAUSE_WORDS]
    # STARTS WITH / ENDS WITH are operators, not the WITH clause.
    marks = [
        (s, e, w)
        for k, (s, e, w) in enumerate(marks)
        if not (w == "WITH" and _word_before(text, words, s) in ("STARTS", "ENDS"))
    ]
    if not marks or marks[0][0] != 0:
        raise _NotSimple("does not start with MATCH")
    scoper = _Scoper(text, restrict_visibility)
    out: list[str] = []
    k = 0
    returned = None
    while k < len(marks):
        start, end, word = marks[k]
        optional = word == "OPTIONAL"
        if optional:
            if k + 1 >= len(marks) or marks[k + 1][2] != "MATCH":
                raise _NotSimple("OPTIONAL without MATCH")
            if text[end : marks[k + 1][0]].strip():
                raise _NotSimple("OPTIONAL without MATCH")
            k += 1
            start, end, word = marks[k]
        if word == "RETURN":
            returned = start
            rest = [w for _, _, w in marks[k + 1 :]]
            if any(w not in _AFTER_RETURN for w in rest):
                raise _NotSimple("a clause after RETURN")
            if re.match(r"(?is)\s*(?:DISTINCT\s+)?\*", text[end:]):
                raise _NotSimple("RETURN *")
            break
        if word != "MATCH":
            raise _NotSimple(f"clause {word}")
        nxt = marks[k + 1] if k + 1 < len(marks) else None
        if nxt is None:
            raise _NotSimple("no RETURN")
        pattern_end = nxt[0]
        where = ""
        k += 1
        if nxt[2] == "WHERE":
            after = marks[k + 1] if k + 1 < len(marks) else None
            if after is None:
                raise _NotSimple("no RETURN")
            where = text[nxt[1] : after[0]].strip()
            if not where:
                raise _NotSimple("empty WHERE")
            k += 1
        pattern = text[end:pattern_end]
        offset = end
        top_here = [i - offset for i in top if offset <= i < pattern_end]
        preds: list[str] = []
        paths = [
            scoper.path(part, preds) for part in _split_at(pattern, top_here, ",") if part.strip()
        ]
        if not paths:
            raise _NotSimple("empty pattern")
        clause = ("OPTIONAL MATCH " if optional else "MATCH ") + ", ".join(paths)
        conditions = preds + ([f"({where})"] if where else [])
        if conditions:
            clause += " WHERE " + " AND ".join(conditions)
        out.append(clause)
    if returned is None or not out:
        raise _NotSimple("no RETURN")
    out.append(text[returned:])
    return " ".join(out)


def _word_before(text: str, words: list[tuple[int, int]], start: int) -> str:
    before = [text[s:e].upper() for s, e in words if e <= start]
    return before[-1] if before else ""
