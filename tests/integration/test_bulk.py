"""``python -m batch_ingest.bulk`` on a local Ray Data actor pool against the real Milvus Lite
server, Neo4j and the default embedder: a folder of JSON lines and Parquet is written with its
ACLs, registry rows and graph nodes, and a second run changes nothing."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_ingest.audit_store import AuditStore
from batch_ingest.bulk import cli
from batch_ingest.chunks import chunk_builder
from batch_ingest.documents import SourceDocument
from batch_ingest.source_store import SourceStore
from tests.integration.test_reindex import TOPICS as REINDEX_TOPICS

pytestmark = pytest.mark.integration

# The reindex tests' topics (the first six, as before).
TOPICS = REINDEX_TOPICS[:6]


@pytest.fixture
def team() -> str:
    return f"bulk_{uuid.uuid4().hex[:8]}"


def rows(n: int) -> list[dict]:
    """``n`` documents of real text, no ``team_id`` (the job's is given); two of every six
    readable by the finance group only, every fifth confidential."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        text = "\n\n".join(
            f"## Part {p}\n\nNotes {i}.{p} about {topic}: who does what, when and why. "
            f"The team agreed on item {p} of document {i}, and {topic} stays on the agenda."
            for p in range(3)
        )
        row = {"doc_id": f"doc{i:03d}", "title": topic, "text": text, "tags": ["bulk"]}
        if i % 6 < 2:
            row["acl"] = {"allowed_groups": ["finance"], "denied_groups": ["interns"]}
        if i % 5 == 0:
            row["visibility"] = "confidential"
        out.append(row)
    return out


async def test_a_bulk_import_on_ray_writes_everything_once_and_a_rerun_changes_nothing(
    ray_local, job_settings, store, graph, team, tmp_path, capsys
):
    given = rows(12)
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in given[:6]))
    # Every column in every row (``from_pylist`` takes the columns of the first row only).
    columns = list(dict.fromkeys(k for r in given for k in r))
    table = pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in given[6:]])
    pq.write_table(table, folder / "b.parquet")
    docs = [SourceDocument.model_validate({**r, "team_id": team}) for r in given]
    audit_url = f"sqlite:///{tmp_path}/audit.db"
    argv = [str(folder), "--team", team, "--actors", "1", "--batch-size", "4"]
    argv += ["--no-progress", "--audit-url", audit_url]
    try:
        assert cli.main(argv, settings=job_settings) == 0
        first = capsys.readouterr().out
        assert "12 documents, indexed 12, unchanged 0, failed 0 (retried 0)" in first

        store.flush(team)
        builder = chunk_builder(job_settings.chunking, job_settings.embedder)
        assert store.count(team) == sum(len(builder.build_chunks(d)) for d in docs)
        for d in docs:
            chunks = store.get_chunks(team, "doc", d.doc_id)
            assert chunks, d.doc_id
            assert {(c.acl_allow, c.acl_deny, c.visibility) for c in chunks} == {
                (d.acl_allow, d.acl_deny, d.visibility)
            }
        sources = SourceStore(job_settings.state.url)
        assert all(sources.get((team, "doc", d.doc_id)) is not None for d in docs)
        nodes = await graph.client.run(
            "MATCH (d:Doc {team_id: $t}) RETURN d.id AS id, d.acl_allow AS allow", {"t": team}
        )
        assert {r["id"]: tuple(r["allow"]) for r in nodes} == {d.doc_id: d.acl_allow for d in docs}

        assert cli.main(argv, settings=job_settings) == 0
        assert "indexed 0, unchanged 12, failed 0" in capsys.readouterr().out
        store.flush(team)
        assert store.count(team) == sum(len(builder.build_chunks(d)) for d in docs)
        records = AuditStore(audit_url).query(action=cli.ACTION)
        assert [r["reason"].split(" chunks=")[0] for r in records] == [
            "documents=12 indexed=0 unchanged=12 failed=0 retried=0",
            "documents=12 indexed=12 unchanged=0 failed=0 retried=0",
        ]
        assert {r["team_id"] for r in records} == {team}
    finally:
        await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True)
