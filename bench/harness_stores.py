"""The benchmark's data in the shared stores, for ``bench.serve_harness.ServeHarness``: an
in-process ``MilvusStore`` on the benchmark collection, dropping that collection (with
retries), and deleting the Neo4j nodes of the benchmark tenants (ingestion MERGEs them into
the shared graph). The harness checks and cleans with them before a start and at its stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("bench.harness")


def milvus_store(settings: Any) -> Any:
    """An in-process ``MilvusStore`` on ``settings``' collection (same settings)."""
    from deployments.models.embedding import embedding_dim
    from deployments.vector_store.store import MilvusStore

    return MilvusStore(settings.milvus, dim=embedding_dim(settings.embedder))


def drop_collection(open_store: Callable[[], Any], collection: str, attempts: int = 5) -> None:
    """Drop the benchmark collection (a store from ``open_store``, named ``collection`` in
    the log), retrying: pymilvus shares one gRPC connection per process, and after minutes
    idle the Milvus Lite server answers its keepalive pings with GOAWAY "too_many_pings",
    which can fail the first reconnect."""
    for attempt in range(1, attempts + 1):
        store = open_store()
        try:
            store.drop()
        except Exception as exc:
            if attempt == attempts:
                raise
            logger.warning("dropping %s failed (%s); retrying in %ds", collection, exc, 2 * attempt)
            time.sleep(2 * attempt)
        else:
            logger.info("dropped Milvus collection %s", collection)
            return
        finally:
            store.close()


def delete_tenant_nodes(cfg: Any, tenant_prefix: str) -> int:
    """Delete every Neo4j node whose team_id starts with ``tenant_prefix`` (``cfg``: the
    gateway's Neo4j settings), 5,000 at a time.

    Returns:
        How many nodes were deleted.
    """
    from neo4j import GraphDatabase

    deleted = 0
    with GraphDatabase.driver(cfg.uri, auth=(cfg.user, cfg.password)) as driver:
        while True:
            records, _, _ = driver.execute_query(
                "MATCH (n) WHERE n.team_id STARTS WITH $prefix "
                "WITH n LIMIT 5000 DETACH DELETE n RETURN count(*) AS n",
                {"prefix": tenant_prefix},
                database_=cfg.database,
            )
            n = int(records[0]["n"]) if records else 0
            deleted += n
            if n == 0:
                break
    if deleted:
        logger.info("deleted %d Neo4j nodes of tenants %s*", deleted, tenant_prefix)
    return deleted
