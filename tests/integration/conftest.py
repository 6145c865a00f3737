from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio

from deployments.config import EmbedderSettings
from deployments.graph_store.store import Neo4jGraph
from deployments.models.embedding import LocalEmbedder
from deployments.vector_store.store import MilvusStore
from serve_app.settings import GatewaySettings
from tests.conftest import require_services
from tests.private_ray import init_private_ray

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def settings(run_id: str) -> GatewaySettings:
    base = require_services()
    return base.model_copy(
        update={"milvus": base.milvus.model_copy(update={"collection": f"it_{run_id}"})}
    )


@pytest.fixture(scope="session")
def store(settings: GatewaySettings):
    store = MilvusStore(settings.milvus, dim=384)
    store.start()
    yield store
    store.drop()
    store.close()


@pytest.fixture(scope="session")
def embedder() -> LocalEmbedder:
    embedder = LocalEmbedder(EmbedderSettings())
    embedder.core.start()
    return embedder


@pytest_asyncio.fixture
async def graph(settings: GatewaySettings):
    graph = Neo4jGraph(settings.neo4j)
    await graph.start()
    yield graph
    await graph.close()


@pytest.fixture(scope="session")
def ray_token() -> Path:
    """One Ray auth token for the whole run: a driver keeps the token it read first, so a
    second private Ray started with another token refused it (InvalidAuthToken)."""
    known = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if known and Path(known).is_file():
        return Path(known)
    token = Path(tempfile.mkdtemp(prefix="rag-it-ray-token-")) / "ray_token"
    token.write_text(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    return token


@pytest.fixture(scope="module")
def ray_local(ray_token: Path):
    """A private local Ray of 2 CPUs (the shipped node's size) for the Ray Data jobs of one
    test module (reindex, bulk import), its files in a temp folder, token auth on."""
    init_private_ray("rag-it-ray-")
    yield
    import ray

    ray.shutdown()


@pytest.fixture
def job_settings(settings, tmp_path):
    """The suite's settings with a state database of the test's own."""
    return settings.model_copy(
        update={"state": settings.state.model_copy(update={"url": f"sqlite:///{tmp_path}/s.db"})}
    )
