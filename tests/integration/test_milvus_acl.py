"""Document ACLs in the real Milvus Lite server: the filter expression, a collection built
before ACLs, and a metadata-only change that keeps the stored vectors (no mocks)."""

from __future__ import annotations

import uuid

import pytest

from batch_ingest.chunking import Chunker
from batch_ingest.documents import SourceDocument
from batch_ingest.pipeline import IngestPipeline
from deployments.acl import principal_tokens
from deployments.errors import Conflict
from deployments.protocols import SearchFilter
from deployments.vector_store import schema as milvus_schema
from deployments.vector_store.deployment import RetrieverDeployment
from deployments.vector_store.store import MilvusStore
from tests.integration.test_milvus_store import chunk, ids, vec

pytestmark = pytest.mark.integration


@pytest.fixture
def team() -> str:
    return f"acl_{uuid.uuid4().hex[:8]}"


def acl_rows(team: str):
    return [
        chunk(team, "open", text=f"{team} budget open notes"),
        chunk(team, "hr", text=f"{team} budget hr salaries", acl_allow=("group:hr",)),
        chunk(team, "alice", text=f"{team} budget alice notes", acl_allow=("user:alice",)),
        chunk(
            team,
            "not_ops",
            text=f"{team} budget for all but ops",
            acl_deny=("group:ops",),
        ),
        chunk(
            team,
            "hr_not_temps",
            text=f"{team} budget hr without temps",
            acl_allow=("group:hr", "user:bob"),
            acl_deny=("group:temps",),
        ),
    ]


CALLERS = [
    (("carol", ()), {"open", "not_ops"}),
    (("alice", ()), {"open", "not_ops", "alice"}),
    (("carol", ("hr",)), {"open", "not_ops", "hr", "hr_not_temps"}),
    (("carol", ("hr", "ops")), {"open", "hr", "hr_not_temps"}),
    (("bob", ("temps",)), {"open", "not_ops"}),
    (("bob", ()), {"open", "not_ops", "hr_not_temps"}),
]


@pytest.mark.parametrize("mode", ["dense", "bm25"])
@pytest.mark.parametrize(("caller", "expected"), CALLERS, ids=lambda v: str(v))
def test_milvus_filters_by_the_callers_acl_tokens(store: MilvusStore, mode, caller, expected):
    team = f"acl_{mode}"
    if store.count(team) != 5:
        store.upsert(acl_rows(team))
        store.flush(team)
    flt = SearchFilter(team_id=team, acl_principals=principal_tokens(*caller))
    hits = store.search(f"{team} budget", vec(f"{team} budget"), flt, 10, mode)
    assert ids(hits) == expected
    # The ACL comes back with each chunk (the result filter behind the store's).
    by_doc = {h.chunk.doc_id: h.chunk for h in hits}
    if "hr_not_temps" in by_doc:
        assert by_doc["hr_not_temps"].acl_allow == ("group:hr", "user:bob")
        assert by_doc["hr_not_temps"].acl_deny == ("group:temps",)


def old_collection(monkeypatch, store: MilvusStore, team: str) -> str:
    """The team's collection as a gateway before document ACLs built it."""
    name = store.collection_for(team)
    with monkeypatch.context() as patch:
        patch.setattr(milvus_schema, "ACL_FIELDS", ())
        store.shapes.create_physical(f"{name}__v1")
    store.conn.call("create alias", "create_alias", f"{name}__v1", name)
    return name


def test_a_collection_built_before_acls_keeps_working(monkeypatch, store, team):
    name = old_collection(monkeypatch, store, team)
    store.upsert([chunk(team, "old", text=f"{team} old budget")])
    assert not store.shapes.has_acl(name)
    # Reads and searches work with the fields absent (documents read back as open) ...
    flt = SearchFilter(team_id=team, acl_principals=principal_tokens("carol", ["hr"]))
    assert ids(store.search(f"{team} budget", None, flt, 5, "bm25")) == {"old"}
    assert store.get_chunks(team, "doc", "old")[0].acl_allow == ("*",)
    assert store.stored_chunks(team, [chunk(team, "old").chunk_id])[0].acl_allow == ("*",)
    # ... more open documents are written ...
    store.upsert([chunk(team, "old2", text=f"{team} more budget")])
    # ... and a document with an access list is refused, naming the way out.
    with pytest.raises(Conflict, match="built before document ACLs") as refused:
        store.upsert([chunk(team, "hr", acl_allow=("group:hr",))])
    assert refused.value.reason == "collection_without_acl"
    assert "reindex" in (refused.value.hint or "")
    assert store.count(team) == 2


def test_reindexed_collection_has_the_acl_fields(monkeypatch, store, team):
    old_collection(monkeypatch, store, team)
    store.upsert([chunk(team, "old")])
    physical = store.versions.create(team, 2)
    assert store.shapes.has_acl(physical)
    store.versions.upsert(physical, [chunk(team, "hr", acl_allow=("group:hr",))])
    store.versions.switch(team, 2)
    assert store.shapes.has_acl(store.collection_for(team))
    store.upsert([chunk(team, "hr2", acl_allow=("group:hr",))])
    flt = SearchFilter(team_id=team, acl_principals=principal_tokens("x", ["hr"]))
    assert ids(store.search("hr", vec("hr"), flt, 5, "dense")) == {"hr", "hr2"}


class CountingEmbedder:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.texts = 0

    async def embed(self, texts, kind="passage"):
        self.texts += len(texts)
        return await self.inner.embed(texts, kind)

    async def status(self):
        return await self.inner.status()


async def test_an_acl_change_repermissions_without_embedding(settings, store, embedder, team):
    counting = CountingEmbedder(embedder)
    retriever = RetrieverDeployment(settings.milvus, 384)
    retriever.store = store  # the Serve shell over the session's store
    pipeline = IngestPipeline(
        embedder=counting,
        store=retriever,
        graph=None,
        chunker=Chunker(lambda t: len(t.split()), 40, 5),
        embed_model="minilm@test",
    )
    text = " ".join(f"Salary review paragraph {i} about the budget of the team." for i in range(30))
    doc = SourceDocument(team_id=team, doc_id="salaries", text=text, title="Salaries")
    first = (await pipeline.ingest([doc])).results[0]
    assert first.status == "indexed" and first.chunks > 2
    embedded = counting.texts
    before = {c.chunk_id: list(c.vector) for c in store.versions.fetch_rows(
        store.collection_for(team), [c.chunk_id for c in pipeline.build_chunks(doc)])}  # fmt: skip
    hr_only = SourceDocument.model_validate(doc.model_dump() | {"acl": {"allowed_groups": ["hr"]}})
    second = (await pipeline.ingest([hr_only])).results[0]
    assert second.status == "indexed"
    assert second.embedded_chunks == 0 and counting.texts == embedded
    rows = store.versions.fetch_rows(store.collection_for(team), list(before))
    assert len(rows) == len(before)
    for row in rows:
        assert list(row.vector) == pytest.approx(before[row.chunk_id])
    assert {c.acl_allow for c in rows} == {("group:hr",)}
    outsider = SearchFilter(team_id=team, acl_principals=principal_tokens("carol", []))
    member = SearchFilter(team_id=team, acl_principals=principal_tokens("carol", ["hr"]))
    assert store.search("salary review", None, outsider, 5, "bm25") == []
    assert ids(store.search("salary review", None, member, 5, "bm25")) == {"salaries"}
    # Sending it again is unchanged; lifting the list opens it, again without embedding.
    assert (await pipeline.ingest([hr_only])).results[0].status == "unchanged"
    third = (await pipeline.ingest([doc])).results[0]
    assert third.embedded_chunks == 0 and counting.texts == embedded
    assert ids(store.search("salary review", None, outsider, 5, "bm25")) == {"salaries"}
