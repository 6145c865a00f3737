"""Document-level access lists as tokens: what a chunk row and a graph ``Doc`` store, what a
caller presents, and the one rule that decides between them.

A document's ``acl`` (``allowed_groups``, ``allowed_users``, ``denied_groups``) is stored as
two token arrays:

- ``acl_allow``: ``group:<g>`` and ``user:<u>`` of the allowed groups and users, or the single
  token ``*`` when neither list is given (everyone the team and visibility rules admit);
- ``acl_deny``: ``group:<g>`` of the denied groups (empty: nobody is denied).

Milvus Lite evaluates array functions (``array_contains_any``) slowly: ~100 ms over 2,365
chunks per term, a 7× slower search (bench/bench_acl_filter.py). So each array also has a
scalar twin that Milvus filters on: ``acl_allow_key`` (``*``, or ``|k1|k2|`` of the tokens'
``token_key`` hashes) and ``acl_deny_key`` (``""`` or ``|k|…``), matched with ``==`` and
``like "%|k|%"``; hex keys hold no ``like`` wildcard and no delimiter, whatever a group name
contains. The arrays are what rows read back (the result filter, the in-memory index).

A caller presents ``*``, ``user:<its subject>`` and ``group:<g>`` for each verified group
(``principal_tokens``). It may see a document when one of its tokens is in ``acl_allow`` and
none is in ``acl_deny``: a denied group wins over an allowed user or group. The same rule is
a Milvus expression (``array_contains_any``), a row mask of the in-memory index and a Cypher
predicate, so every path makes one decision.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

OPEN = "*"
GROUP = "group:"
USER = "user:"
# Entries per list of one document (each list; the token arrays hold both allow lists).
MAX_ACL_ENTRIES = 64
MAX_ACL_TOKENS = 2 * MAX_ACL_ENTRIES
# Chunk row fields (ARRAY<VARCHAR>) of a collection built with document ACLs, and their
# scalar twins Milvus filters on.
ACL_FIELDS = ("acl_allow", "acl_deny")
ACL_KEY_FIELDS = ("acl_allow_key", "acl_deny_key")
KEY_OF = dict(zip(ACL_FIELDS, ACL_KEY_FIELDS, strict=True))
OPEN_ALLOW: tuple[str, ...] = (OPEN,)
TOKEN_KEY_CHARS = 16
ACL_KEY_LENGTH = (TOKEN_KEY_CHARS + 1) * MAX_ACL_TOKENS + 1


def allow_tokens(groups: Iterable[str] = (), users: Iterable[str] = ()) -> tuple[str, ...]:
    """The ``acl_allow`` array of a document: its allowed groups and users, or ``("*",)``."""
    tokens = [GROUP + g for g in dict.fromkeys(groups)] + [USER + u for u in dict.fromkeys(users)]
    return tuple(tokens) if tokens else OPEN_ALLOW


def deny_tokens(groups: Iterable[str] = ()) -> tuple[str, ...]:
    """The ``acl_deny`` array of a document: its denied groups."""
    return tuple(GROUP + g for g in dict.fromkeys(groups))


def principal_tokens(user_id: str, groups: Iterable[str]) -> tuple[str, ...]:
    """What a caller presents: ``*``, its subject and its groups, in a stable order."""
    tokens = [OPEN]
    if user_id:
        tokens.append(USER + user_id)
    tokens += [GROUP + g for g in sorted(set(groups))]
    return tuple(tokens)


def group_tokens(principals: Sequence[str]) -> tuple[str, ...]:
    """The group tokens among a caller's (what a deny list can name)."""
    return tuple(t for t in principals if t.startswith(GROUP))


def admits(allow: Sequence[str], deny: Sequence[str], principals: Sequence[str]) -> bool:
    """The rule: a caller token in ``allow`` (empty counts as open) and none in ``deny``."""
    return admits_held(allow, deny, frozenset(principals))


def admits_held(allow: Sequence[str], deny: Sequence[str], held: frozenset[str]) -> bool:
    """``admits`` with the caller's tokens as a set already (one per request, not per chunk).
    Disjointness tests, no intersection built: the result filter asks this of every
    candidate chunk."""
    allowed = not held.isdisjoint(allow) if allow else OPEN in held
    return allowed and held.isdisjoint(deny)


def is_open(allow: Sequence[str], deny: Sequence[str]) -> bool:
    """Whether the arrays restrict nobody (what a collection without ACL fields can hold)."""
    return tuple(allow or OPEN_ALLOW) == OPEN_ALLOW and not deny


def token_key(token: str) -> str:
    """The hex key of one token in the scalar twins (``*`` stays ``*``)."""
    if token == OPEN:
        return OPEN
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:TOKEN_KEY_CHARS]


def tokens_key(tokens: Sequence[str], *, empty: str) -> str:
    """The scalar twin of a token array: ``empty`` for none, ``*`` for the open one, else
    ``|k1|k2|…|``."""
    if not tokens:
        return empty
    if tuple(tokens) == OPEN_ALLOW:
        return OPEN
    return "|" + "|".join(token_key(t) for t in tokens) + "|"
