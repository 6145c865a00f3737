"""The source registry and its document leases on the real PostgreSQL (scripts/services.py),
the store several consumer and gateway replicas share in production."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from batch_ingest.documents import SourceDocument
from batch_ingest.source_store import SourceStore
from tests.integration.test_audit_postgres import postgres_url

pytestmark = pytest.mark.integration


@pytest.fixture
def store(run_id: str, request):
    table = f"sources_it_{run_id}_{abs(hash(request.node.name)) % 10**6}"
    store = SourceStore(postgres_url(), table)
    yield store
    store.metadata.drop_all(store.engine, checkfirst=True)
    store.close()


def test_versions_and_tombstones_on_postgres(store):
    key = ("t1", "doc", "a")
    store.put([SourceDocument(team_id="t1", doc_id="a", text="v3")], {key: 3})
    assert not store.should_apply(key, 3) and store.should_apply(key, 4)
    store.put([SourceDocument(team_id="t1", doc_id="a", text="v4")], {key: 4}, keep_version={key})
    row = store.get(key)
    assert row.version == 3 and row.document.text == "v4"
    store.tombstone(key, 5)
    assert store.count("t1") == 0 and not store.should_apply(key, 4)


def test_racing_writers_get_a_lease_exactly_once_on_postgres(store):
    keys = [("t1", "doc", f"hot{i}") for i in range(5)]
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: store.claim(keys, f"w{i}", 60), range(16)))
    # Every key has exactly one holder, whichever writer got it.
    for key in keys:
        assert sum(key in held for held in won) == 1
    holder = next(i for i, held in enumerate(won) if keys[0] in held)
    store.release([keys[0]], f"w{holder}")
    assert store.claim([keys[0]], "late", 60) == {keys[0]}
    assert store.claim([keys[1]], "late", ttl_s=60) == set()
