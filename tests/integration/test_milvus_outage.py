"""Milvus going away under a connected store: a write fails within
``milvus.write_timeout_s`` (``BackendUnavailable`` naming Milvus) instead of waiting for a
server that never answers (ingestion writes used to end only with Serve's 120 s timeout)."""

from __future__ import annotations

import asyncio
import time
import uuid
from urllib.parse import urlparse

import pytest

from deployments.errors import BackendUnavailable
from deployments.vector_store.store import MilvusStore
from tests.integration.test_milvus_store import chunk
from tests.neo4j_proxy import BoltProxy

pytestmark = pytest.mark.integration


async def test_writes_fail_within_the_deadline_when_milvus_stops_answering(settings):
    target = urlparse(settings.milvus.uri)
    proxy = BoltProxy(target.hostname or "127.0.0.1", target.port or 19530)
    await proxy.start()
    update = {
        "uri": f"http://127.0.0.1:{proxy.port}",
        "collection": f"{settings.milvus.collection}_outage",
        "write_timeout_s": 2.0,
        "timeout_s": 2.0,
    }
    store = MilvusStore(settings.milvus.model_copy(update=update), dim=384)
    team = f"team_{uuid.uuid4().hex[:8]}"
    try:
        await asyncio.to_thread(store.start)
        assert await asyncio.to_thread(store.upsert, [chunk(team, "a")]) == 1
        proxy.go_away("blackhole")
        for name, call in (
            ("upsert", lambda: store.upsert([chunk(team, "b")])),
            ("delete", lambda: store.delete_chunks(team, [chunk(team, "a").chunk_id])),
        ):
            started = time.perf_counter()
            with pytest.raises(BackendUnavailable) as err:
                await asyncio.to_thread(call)
            took = time.perf_counter() - started
            assert took < 2.0 * 2 + 2.0, f"{name} took {took:.1f} s"
            assert err.value.backend == "milvus"
    finally:
        proxy.go_away("refuse")
        await proxy.close()
        direct = MilvusStore(
            settings.milvus.model_copy(update={"collection": update["collection"]}), dim=384
        )
        await asyncio.to_thread(direct.drop)
        direct.close()
