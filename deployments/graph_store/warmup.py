"""Plan the gateway's own graph reads before a caller asks for them.

A statement read through ``Neo4jClient.read_own`` has one plan whatever its parameters
(params.py), so planning it once at start-up serves every caller after: an ``EXPLAIN`` with
the bundled text fills Neo4j's plan cache (measured on ``RELATED_PROJECTS`` with emptied
caches: EXPLAIN 960 ms, then the first run 134 ms instead of ~1.1 s, the next 1.7 ms). The
cache lives in the Neo4j server, so only the first replica after a Neo4j start pays; the
others find each plan cached in milliseconds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from deployments.graph_store.client import Neo4jClient
from deployments.graph_store.cypher import (
    ACL_HIDDEN,
    DEFAULT_PATH_HOPS,
    ENTITIES,
    RELATED_DOCS,
    RESOLVE,
    shortest_paths,
)
from deployments.graph_store.intents import INTENTS
from deployments.graph_store.params import bound, bundled
from deployments.protocols import GraphScope

logger = logging.getLogger(__name__)
# Seconds each warm-up step (the connection and schema set-up, one EXPLAIN) may take.
PATIENCE_S = 30.0


def own_reads() -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, text, parameters)`` of each statement ``read_own`` runs with a fixed text,
    with parameters of the right types. explain_path's path query carries its hop bound in
    its text: the default bound's is planned here, another bound's by its first caller."""
    scope = GraphScope("warm-up", ("public",)).params
    out = [
        (name, i.cypher, {**scope, **i.args.model_validate(i.example).model_dump()})
        for name, i in INTENTS.items()
    ]
    search = {"lucene": "warm", "max_entities": 5, "max_docs": 50}
    out += [
        ("ACL_HIDDEN", ACL_HIDDEN, scope),
        ("ENTITIES", ENTITIES, {**scope, **search}),
        ("RELATED_DOCS", RELATED_DOCS, {**scope, **search}),
        ("RESOLVE", RESOLVE, {**scope, "ref": "warm", "label": None, "limit": 5}),
        (
            f"SHORTEST_PATHS({DEFAULT_PATH_HOPS})",
            shortest_paths(DEFAULT_PATH_HOPS),
            {
                **scope,
                "sources": [["Person", "warm"]],
                "targets": [["Project", "warm"]],
                "max_paths": 3,
            },
        ),
    ]
    return out


async def warm_plans(client: Neo4jClient, patience_s: float = PATIENCE_S) -> int:
    """EXPLAIN each of ``own_reads`` once; how many Neo4j planned.

    No caller waits for this, so each step gets ``patience_s`` rather than a caller's
    deadline: in a fresh Neo4j on two busy vCPUs the connection and schema set-up took over
    the 8 s deadline, and the next EXPLAIN (the JVM's first plans: class loading, the JIT)
    over the 5 s left of it, so the first two intents were left to their callers, one of whom
    then waited 5.9 s (503). A statement that fails is tried once more after the others; one
    that fails again (Neo4j away, a timeout) is logged and left to its first caller."""
    started = time.perf_counter()
    try:
        await client.start(patience_s)
    except Exception as exc:
        logger.warning("graph: Neo4j not ready (%s); reads are planned by their first callers", exc)
        return 0
    left = own_reads()
    planned = 0
    for attempt in (1, 2):
        failed = []
        for name, text, params in left:
            try:
                await client.explain(bundled(text), bound(params), deadline_s=patience_s)
                planned += 1
            except Exception as exc:
                failed.append((name, text, params))
                if attempt == 2:
                    logger.warning(
                        "graph: could not plan %s ahead (%s); its first caller will", name, exc
                    )
        left = failed
        if not left:
            break
    logger.info(
        "graph: planned %d of the gateway's own reads ahead in %.1f s",
        planned,
        time.perf_counter() - started,
    )
    return planned
