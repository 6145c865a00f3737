"""Serve health checks of the deployment shells (deployments/health.py): a model that failed
to load fails its replica at once; a backend fails its replica only after several failed
checks in a row, and one good answer resets the count."""

from __future__ import annotations

import asyncio

import pytest

from deployments.errors import BackendUnavailable
from deployments.health import BackendHealth, check_model
from deployments.loading import BackgroundLoad


async def test_a_model_that_failed_to_load_fails_the_replica():
    def broken() -> None:
        raise OSError("no weights at /models/x")

    loading = BackgroundLoad(broken, "embedder")
    with pytest.raises(BackendUnavailable):
        await loading.wait()
    with pytest.raises(RuntimeError, match="no weights"):
        check_model(loading)


async def test_a_model_still_loading_is_healthy():
    loading = BackgroundLoad(lambda: None, "reranker")
    check_model(loading)  # not begun: healthy
    await loading.wait()
    check_model(loading)


async def test_a_backend_fails_the_replica_only_after_failures_in_a_row():
    answers = iter([False, False, True, False, False, False])

    async def status():
        ready = next(answers)
        if not ready:
            return {"ready": False, "error": "connection refused"}
        return {"ready": True}

    health = BackendHealth("milvus", status, limit=3)
    for _ in range(5):
        await health.check()  # 2 failures, a success resets, then 2 more
    with pytest.raises(RuntimeError, match="3 failed health checks in a row"):
        await health.check()


async def test_a_status_that_raises_or_hangs_counts_as_a_failure(monkeypatch):
    from deployments import health as module

    monkeypatch.setattr(module, "STATUS_TIMEOUT_S", 0.05)

    async def hang():
        await asyncio.sleep(10)
        return {"ready": True}

    health = BackendHealth("neo4j", hang, limit=1)
    with pytest.raises(RuntimeError, match="TimeoutError"):
        await health.check()
