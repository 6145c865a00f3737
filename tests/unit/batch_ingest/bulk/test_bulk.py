"""The bulk import (``python -m batch_ingest.bulk``): reading and validating its input, the
local engine over a fake pipeline (each document once, failures retried once), its summary,
exit codes and audit record. The Ray Data engine against the real services is in
tests/integration/test_bulk.py."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_ingest.audit_store import AuditStore
from batch_ingest.bulk import cli
from batch_ingest.bulk.sources import InputError, read_documents
from batch_ingest.bulk.worker import BulkWorker
from batch_ingest.chunking import Chunker, whitespace_tokens
from batch_ingest.documents import SourceDocument
from batch_ingest.ingest_report import DocResult
from batch_ingest.pipeline import IngestPipeline
from batch_ingest.reindex import engines
from batch_ingest.settings import BatchSettings
from batch_ingest.source_store import SourceStore
from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeVectorStore

TEAM = "dao_bulk"
ACL = {"allowed_groups": ["finance"], "denied_groups": ["interns"]}


def doc(doc_id: str, text: str = "", **more) -> dict:
    return {"doc_id": doc_id, "text": text or f"notes of {doc_id} about solar panels", **more}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def fake_pipeline(tmp_path: Path, **store) -> IngestPipeline:
    return IngestPipeline(
        embedder=FakeEmbedder(dim=16),
        store=FakeVectorStore(**store),
        graph=FakeGraphStore(),
        chunker=Chunker(whitespace_tokens, 20, 4),
        embed_model="fake@v1",
        sources=SourceStore(f"sqlite:///{tmp_path}/state.db"),
    )


class Flaky:
    """``pipeline``, failing the documents named: ``once`` on their first try, ``always`` on
    every one; ``calls`` counts the tries of each document."""

    def __init__(self, pipeline: IngestPipeline, once=(), always=()) -> None:
        self.inner, self.graph = pipeline, pipeline.graph
        self.once, self.always = set(once), set(always)
        self.calls: Counter[str] = Counter()

    async def ingest(self, docs):
        for d in docs:
            self.calls[d.doc_id] += 1
        bad = {
            d.doc_id
            for d in docs
            if d.doc_id in self.always or (d.doc_id in self.once and self.calls[d.doc_id] == 1)
        }
        report = await self.inner.ingest([d for d in docs if d.doc_id not in bad])
        report.results += [
            DocResult(d.doc_id, d.team_id, "failed", error="injected refusal", doc_type="doc")
            for d in docs
            if d.doc_id in bad
        ]
        return report


def run(tmp_path: Path, source: Path, pipeline, *more: str) -> int:
    argv = [str(source), "--team", TEAM, "--local", "--no-progress", "--batch-size", "2"]
    argv += ["--audit-url", f"sqlite:///{tmp_path}/audit.db", "--operator", "ops-alice"]
    return cli.main([*argv, *more], settings=BatchSettings(), pipeline=pipeline)


def audit_rows(tmp_path: Path) -> list[dict]:
    return AuditStore(f"sqlite:///{tmp_path}/audit.db").query(action=cli.ACTION)


# --- reading and validation -----------------------------------------------------------------


def test_jsonl_rows_are_validated_and_a_missing_team_is_the_jobs(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [doc("a"), doc("b", team_id=TEAM), doc("c")])
    path.write_text(path.read_text() + "\n   \n", encoding="utf-8")  # blank lines are skipped
    rows = read_documents(path, TEAM)
    assert [(r.where, r.doc.doc_id, r.doc.team_id) for r in rows] == [
        (f"{path}:1", "a", TEAM),
        (f"{path}:2", "b", TEAM),
        (f"{path}:3", "c", TEAM),
    ]


def test_parquet_nulls_are_absent_fields_and_timestamps_iso(tmp_path):
    table = pa.table(
        {
            "doc_id": ["p1", "p2"],
            "text": ["first parquet document", "second parquet document"],
            "title": ["One", None],
            "created_at": pa.array(
                [datetime(2024, 3, 1, tzinfo=UTC), None], pa.timestamp("s", tz="UTC")
            ),
            "tags": [["solar", "roof"], None],
            "acl": [ACL, None],
        }
    )
    pq.write_table(table, tmp_path / "docs.parquet")
    p1, p2 = (r.doc for r in read_documents(tmp_path / "docs.parquet", TEAM))
    assert (p1.team_id, p1.title, p1.tags, p1.created_at) == (TEAM, "One", ["solar", "roof"],
                                                              1_709_251_200)  # fmt: skip
    assert p1.acl is not None and p1.acl.allowed_groups == ["finance"]
    assert (p2.title, p2.tags, p2.created_at, p2.acl) == ("", [], 0, None)


def test_a_folder_reads_its_jsonl_and_parquet_files_by_name(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "b.jsonl", [doc("b1"), doc("b2")])
    pq.write_table(pa.table({"doc_id": ["a1"], "text": ["from parquet"]}), folder / "a.parquet")
    write_jsonl(folder / "sub" / "c.jsonl", [doc("c1")])  # subfolders are not read
    write_jsonl(folder / ".hidden.jsonl", [doc("h1")])
    (folder / "notes.txt").write_text("not an input")
    rows = read_documents(folder, TEAM)
    assert [r.doc.doc_id for r in rows] == ["a1", "b1", "b2"]
    assert rows[0].where == f"{folder / 'a.parquet'} row 1"


@pytest.mark.parametrize(
    ("rows", "wanted"),
    [
        ([doc("a"), doc("b", text="   ")], ["docs.jsonl:2", "field text"]),
        ([doc("a"), doc("b", team_id="dao_other")], ["docs.jsonl:2", "field team_id", "dao_other"]),
        ([doc("a", dao_id="dao_other")], ["docs.jsonl:1", "field team_id", "dao_other"]),
        ([doc("a"), doc("a")], ["docs.jsonl:2", "doc:a is also at", "docs.jsonl:1"]),
        ([doc("a", acl={"groups": ["x"]})], ["docs.jsonl:1", "field acl.groups"]),
        ([doc("a"), ["not", "an", "object"]], ["docs.jsonl:2", "not a JSON object"]),
    ],
)
def test_a_bad_row_is_named_by_file_line_and_field(tmp_path, rows, wanted):
    path = write_jsonl(tmp_path / "docs.jsonl", rows)
    with pytest.raises(InputError) as caught:
        read_documents(path, TEAM)
    for part in wanted:
        assert part in str(caught.value)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps(doc("a")) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"docs\.jsonl:2: not JSON"):
        read_documents(path, TEAM)


def test_inputs_of_another_kind_are_refused(tmp_path):
    (tmp_path / "docs.csv").write_text("doc_id,text\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.parquet").write_text("not parquet")
    for path, wanted in [
        (tmp_path / "docs.csv", "not a .jsonl or .parquet file"),
        (tmp_path / "empty", "holds no *.jsonl or *.parquet file"),
        (tmp_path / "missing.jsonl", "no such file or folder"),
        (tmp_path / "broken.parquet", "not a readable Parquet file"),
    ]:
        with pytest.raises(InputError, match=wanted.replace("*", r"\*").replace(".", r"\.")):
            read_documents(path, TEAM)
    with pytest.raises(InputError, match="--team"):
        read_documents(tmp_path / "docs.csv", " ")


# --- the job over a fake pipeline -----------------------------------------------------------


def test_a_bad_row_stops_the_job_before_anything_is_written(tmp_path, capsys):
    rows = [doc(f"d{i}") for i in range(5)] + [doc("bad", team_id="dao_other")]
    pipeline = Flaky(fake_pipeline(tmp_path))
    assert run(tmp_path, write_jsonl(tmp_path / "docs.jsonl", rows), pipeline) == 2
    err = capsys.readouterr().err
    assert "docs.jsonl:6: field team_id" in err and "nothing was written" in err
    assert pipeline.calls == Counter() and pipeline.inner.store.rows == {}
    assert audit_rows(tmp_path) == []


def test_every_document_is_written_once_with_its_acl_graph_and_registry(tmp_path, capsys):
    rows = [doc("d0", acl=ACL, visibility="confidential")] + [doc(f"d{i}") for i in range(1, 5)]
    pipeline = Flaky(fake_pipeline(tmp_path))
    assert run(tmp_path, write_jsonl(tmp_path / "docs.jsonl", rows), pipeline) == 0
    assert pipeline.calls == Counter({f"d{i}": 1 for i in range(5)})
    chunks = list(pipeline.inner.store.rows.values())
    assert {c.team_id for c in chunks} == {TEAM}
    [acl_chunk] = [c for c in chunks if c.doc_id == "d0"]
    wanted = SourceDocument.model_validate({**rows[0], "team_id": TEAM})
    assert (acl_chunk.acl_allow, acl_chunk.acl_deny, acl_chunk.visibility) == (
        wanted.acl_allow,
        wanted.acl_deny,
        "confidential",
    )
    assert pipeline.inner.graph.docs[(TEAM, "d0")].acl_allow == wanted.acl_allow
    sources = pipeline.inner.sources
    assert all(sources.get((TEAM, "doc", f"d{i}")) is not None for i in range(5))
    out = capsys.readouterr().out
    assert "5 documents, indexed 5, unchanged 0, failed 0 (retried 0); 5 chunks" in out


def test_a_second_run_writes_nothing_and_says_unchanged(tmp_path, capsys):
    path = write_jsonl(tmp_path / "docs.jsonl", [doc(f"d{i}") for i in range(3)])
    pipeline = fake_pipeline(tmp_path)
    assert run(tmp_path, path, pipeline) == 0
    embedded = len(pipeline.embedder.embedded_texts)
    assert run(tmp_path, path, pipeline) == 0
    assert len(pipeline.embedder.embedded_texts) == embedded
    assert "indexed 0, unchanged 3, failed 0" in capsys.readouterr().out.splitlines()[-1]
    assert [r["reason"] for r in audit_rows(tmp_path)] == [
        "documents=3 indexed=0 unchanged=3 failed=0 retried=0 chunks=3",
        "documents=3 indexed=3 unchanged=0 failed=0 retried=0 chunks=3",
    ]


def test_failed_documents_are_retried_once_and_what_still_fails_is_listed(tmp_path, capsys):
    path = write_jsonl(tmp_path / "docs.jsonl", [doc(f"d{i}") for i in range(6)])
    pipeline = Flaky(fake_pipeline(tmp_path), once={"d1"}, always={"d4"})
    assert run(tmp_path, path, pipeline) == 1
    assert pipeline.calls == Counter({"d0": 1, "d1": 2, "d2": 1, "d3": 1, "d4": 2, "d5": 1})
    out = capsys.readouterr().out
    assert "6 documents, indexed 5, unchanged 0, failed 1 (retried 2)" in out
    assert f"not imported: {path}:5 (doc:d4): injected refusal" in out
    [record] = audit_rows(tmp_path)
    assert record["reason"] == "documents=6 indexed=5 unchanged=0 failed=1 retried=2 chunks=5"


def test_a_batch_the_store_refuses_whole_is_retried(tmp_path, capsys):
    # The first upsert raises BackendUnavailable: the pipeline refuses its batch whole.
    pipeline = Flaky(fake_pipeline(tmp_path, fail_on_upsert=1))
    path = write_jsonl(tmp_path / "docs.jsonl", [doc(f"d{i}") for i in range(4)])
    assert run(tmp_path, path, pipeline) == 0
    assert pipeline.calls == Counter({"d0": 2, "d1": 2, "d2": 1, "d3": 1})
    assert "indexed 4, unchanged 0, failed 0 (retried 2)" in capsys.readouterr().out


def test_documents_the_graph_missed_are_retried_and_merged(tmp_path, capsys):
    pipeline = fake_pipeline(tmp_path)
    merge = pipeline.graph.merge_documents
    tries = Counter[str]()

    async def down_once(docs):
        tries["merge"] += 1
        if tries["merge"] == 1:
            raise RuntimeError("neo4j went away")
        return await merge(docs)

    pipeline.graph.merge_documents = down_once
    path = write_jsonl(tmp_path / "docs.jsonl", [doc(f"d{i}") for i in range(4)])
    assert run(tmp_path, path, pipeline) == 0
    assert set(pipeline.graph.docs) == {(TEAM, f"d{i}") for i in range(4)}
    assert "indexed 2, unchanged 2, failed 0 (retried 2)" in capsys.readouterr().out


def test_the_audit_record_names_the_operator_team_input_and_counts(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [doc("d0"), doc("d1")])
    assert run(tmp_path, path, fake_pipeline(tmp_path)) == 0
    [record] = audit_rows(tmp_path)
    assert (record["subject"], record["auth_method"], record["team_id"]) == (
        "ops-alice",
        "cli",
        TEAM,
    )
    assert record["resource"] == f"team:{TEAM}/bulk:{path.resolve()}"
    assert record["decision"] == "allow" and record["path"] == "batch_ingest.bulk"
    assert record["reason"].startswith("documents=2 indexed=2")


def test_nothing_is_written_when_the_audit_log_cannot_be(tmp_path, capsys):
    (tmp_path / "gone").write_text("a file where the audit database's folder should be")
    (tmp_path / "garbage.db").write_text("a file where the audit database should be" * 100)
    pipeline = Flaky(fake_pipeline(tmp_path))
    path = write_jsonl(tmp_path / "docs.jsonl", [doc("d0")])
    for audit in ("gone/audit.db", "garbage.db"):
        argv = [str(path), "--team", TEAM, "--local", "--no-progress"]
        argv += ["--audit-url", f"sqlite:///{tmp_path}/{audit}"]
        assert cli.main(argv, settings=BatchSettings(), pipeline=pipeline) == 1
        assert "audit log cannot be written" in capsys.readouterr().err
    assert pipeline.calls == Counter() and pipeline.inner.store.rows == {}


def test_a_dry_run_counts_and_writes_nothing(tmp_path, capsys):
    rows = [doc("d0", acl=ACL), doc("d1", visibility="confidential"), doc("d2")]
    pipeline = Flaky(fake_pipeline(tmp_path))
    assert run(tmp_path, write_jsonl(tmp_path / "docs.jsonl", rows), pipeline, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "dry run: 3 documents of team dao_bulk in 1 files" in out
    assert "1 with an ACL, 1 confidential; nothing was written" in out
    assert pipeline.calls == Counter() and audit_rows(tmp_path) == []


def test_the_worker_never_writes_a_document_of_another_team(tmp_path):
    pipeline = Flaky(fake_pipeline(tmp_path))
    worker = BulkWorker({}, TEAM, pipeline=pipeline)  # type: ignore[arg-type]
    other = SourceDocument.model_validate(doc("x", team_id="dao_other")).model_dump_json()
    mine = SourceDocument.model_validate(doc("y", team_id=TEAM)).model_dump_json()
    # A Ray Data batch: numpy columns in, lists out.
    out = worker({"document": np.array([other, mine])})
    assert out["doc_id"] == ["x", "y"] and out["status"] == ["failed", "indexed"]
    assert out["error"][0] == f"not team {TEAM!r}" and out["error"][1] == ""
    assert pipeline.calls == Counter({"y": 1})
    worker.close()


def test_ray_result_batches_reach_the_sink_as_plain_values():
    # A Ray Data result batch in numpy format: numpy scalars, which the sink must not get.
    batch = {"doc_id": np.array(["a", "b"]), "chunks": np.array([3, 4])}
    batch["error"] = np.array(["", "x"])

    class Dataset:
        def iter_batches(self, **_):
            yield batch

    rows: list = []
    engines._drain(Dataset(), rows.extend, threading.Event(), None)
    assert rows == [
        {"doc_id": "a", "chunks": 3, "error": ""},
        {"doc_id": "b", "chunks": 4, "error": "x"},
    ]
    assert all(type(v) in (str, int) for r in rows for v in r.values())


# --- a Markdown vault, exported for the bulk import -----------------------------------------


def test_a_vault_exported_as_json_lines_is_a_bulk_input(tmp_path, capsys):
    from serve_app.cli import vault

    root = tmp_path / "vault"
    (root / "finance").mkdir(parents=True)
    (root / "README.md").write_text("# Readme\n\nSee [[budget]].\n")
    (root / "finance" / "_access.yaml").write_text("acl:\n  allowed_groups: [finance]\n")
    (root / "finance" / "budget.md").write_text("---\ntitle: Budget\n---\nThe 2024 budget.\n")
    out = tmp_path / "vault.jsonl"
    assert vault.main([str(root), "--team", TEAM, "--export", str(out)], client=object()) == 0
    assert "exported 2 notes" in capsys.readouterr().out
    rows = {r.doc.doc_id: r.doc for r in read_documents(out, TEAM)}
    assert set(rows) == {"README.md", "finance/budget.md"}
    assert rows["finance/budget.md"].acl is not None
    assert rows["finance/budget.md"].acl.allowed_groups == ["finance"]
    assert rows["README.md"].source_id == rows["finance/budget.md"].source_id != ""


def test_an_empty_input_writes_nothing_and_is_audited(tmp_path, capsys):
    pipeline = Flaky(fake_pipeline(tmp_path))
    assert run(tmp_path, write_jsonl(tmp_path / "docs.jsonl", []), pipeline) == 0
    assert "0 documents, indexed 0" in capsys.readouterr().out
    assert pipeline.calls == Counter()
    assert audit_rows(tmp_path)[0]["reason"].startswith("documents=0 indexed=0")
