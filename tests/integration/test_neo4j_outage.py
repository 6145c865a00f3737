"""Neo4j going away under a connected gateway: every graph call answers within
``neo4j.deadline_s`` (503 naming Neo4j), instead of the driver retrying its managed
transactions for 30 s (graph calls hung 33-65 s in an outside fault run)."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import pytest

from deployments.errors import BackendUnavailable
from deployments.graph_store.store import Neo4jGraph
from tests.neo4j_proxy import BoltProxy

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["refuse", "blackhole"])
async def test_graph_calls_fail_within_the_deadline_when_neo4j_goes_away(settings, mode):
    target = urlparse(settings.neo4j.uri)
    proxy = BoltProxy(target.hostname or "127.0.0.1", target.port or 7687)
    await proxy.start()
    graph = Neo4jGraph(settings.neo4j.model_copy(update={"uri": proxy.uri, "deadline_s": 3.0}))
    try:
        await graph.start()
        assert (await graph.client.run("RETURN 1 AS one"))[0]["one"] == 1
        proxy.go_away(mode)
        for call in (
            lambda: graph.client.run("RETURN 1 AS one"),
            lambda: graph.client.read("RETURN 1 AS one", {}, max_rows=10),
        ):
            started = time.perf_counter()
            with pytest.raises(BackendUnavailable) as err:
                await call()
            took = time.perf_counter() - started
            assert took < 3.0 + 2.0, f"{mode}: took {took:.1f} s"
            assert "neo4j" in err.value.message.lower() or err.value.backend == "neo4j"
        status = await graph.status()
        assert status["ready"] is False
    finally:
        await graph.close()
        await proxy.close()
