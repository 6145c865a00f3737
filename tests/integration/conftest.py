from __future__ import annotations

import pytest
import pytest_asyncio

from deployments.config import EmbedderSettings
from deployments.embedding import LocalEmbedder
from deployments.graph_store import Neo4jGraph
from deployments.milvus_store import MilvusStore
from serve_app.settings import GatewaySettings
from tests.conftest import require_services

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
