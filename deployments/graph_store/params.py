"""The gateway's own Cypher reads its parameters from one map, ``$p``, so that Neo4j keeps
one plan per query.

Neo4j 5 keys its plan cache by the query text and, for every string and list parameter,
the power-of-ten bucket of its length (``internal.cypher.use_parameter_size``): a team id of
12 characters, two visibilities instead of one or three ACL principals instead of one each
make a new key, and a template as large as an intent's takes 0.2–4 s to plan on 2 cores — on
a loaded server past the query timeout. A map parameter is keyed by its type alone, so
``$p.team_id`` plans once for every caller (bench/README.md, "Graph plans"). The plans keep
their index seeks; only the estimated sizes of ``IN $p.list`` become the planner's default.

Only for text the gateway writes (intent templates, its own reads through
``Neo4jClient.read_own``, its write statements through ``tx_rows``): a caller's Cypher keeps
its own parameters, and the guard proves it with the flat names (``deployments/graph_store/
guard.py``). ``flat_plan`` turns the plan of a bundled query back into those names, so the
templates are proven by the same check.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from deployments.graph_store.scope import after_quoted

PARAM_MAP = "p"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=256)
def bundled(query: str) -> str:
    """``query`` with each ``$name`` outside string literals, quoted names and comments
    read as ``$p.name``.

    Raises:
        ValueError: a parameter that is not a plain name (``$0``, ``$`x y` ``): the gateway's
            own text never has one, and the rewrite would be ambiguous.
    """
    out: list[str] = []
    i, n = 0, len(query)
    while i < n:
        c = query[i]
        if c in "'\"`":
            end = after_quoted(query, i)
            out.append(query[i:end])
            i = end
        elif query.startswith("//", i):
            end = query.find("\n", i)
            end = n if end < 0 else end
            out.append(query[i:end])
            i = end
        elif query.startswith("/*", i):
            end = query.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(query[i:end])
            i = end
        elif c == "$":
            name = _IDENT.match(query, i + 1)
            if name is None:
                raise ValueError(f"not a plain parameter name at {query[i : i + 12]!r}")
            out.append(f"${PARAM_MAP}.{name.group()}")
            i = name.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def bound(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a ``bundled`` query."""
    return {PARAM_MAP: params}


_BUNDLED_REF = re.compile(rf"\${PARAM_MAP}\.(?={_IDENT.pattern})")


def flat_plan(plan: Any) -> Any:
    """A plan of a ``bundled`` query with ``$p.name`` written ``$name`` again in every
    operator's arguments (what the guard reads)."""
    if isinstance(plan, dict):
        return {k: flat_plan(v) for k, v in plan.items()}
    if isinstance(plan, list):
        return [flat_plan(v) for v in plan]
    if isinstance(plan, str):
        return _BUNDLED_REF.sub("$", plan)
    return plan
