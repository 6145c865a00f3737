"""The embedding ledger: every ingestion records the passage tokens it embedded per team, in
the state database, and GET /admin/usage reads it (owner or audit:read only)."""

from __future__ import annotations

import asyncio
import threading

from batch_ingest.chunking import whitespace_tokens
from batch_ingest.source_store import SourceStore
from batch_ingest.usage import EmbeddingUsage, main
from serve_app.testing import build_gateway, claims, mint

TEAM = "dao_meter"


def auth(*roles: str, team: str = TEAM, **extra) -> dict[str, str]:
    return {"authorization": f"Bearer {mint(claims(teams={team: list(roles)}, **extra))}"}


def test_api_ingestion_is_metered_and_readable_by_an_owner(tmp_path):
    gw = build_gateway(state_url=f"sqlite:///{tmp_path / 'state.db'}")
    docs = [
        {"team_id": TEAM, "doc_id": f"d{i}", "text": f"grid battery solar panel report {i} " * 30}
        for i in range(3)
    ]
    r = gw.client.post("/ingest/documents", json={"documents": docs}, headers=auth("service"))
    assert r.status_code == 200, r.text
    chunks = [c for d in docs for c in gw.services.pipeline.build_chunks(_doc(d))]
    expected = sum(whitespace_tokens(c.text) for c in chunks)
    body = gw.client.get(f"/admin/usage?team_id={TEAM}", headers=auth("owner")).json()
    (row,) = body["usage"]
    assert row["source"] == "api" and row["chunks"] == len(chunks)
    assert row["tokens"] == expected and body["totals"][TEAM]["tokens"] == expected
    # Re-sending unchanged documents embeds nothing, so the ledger stays.
    gw.client.post("/ingest/documents", json={"documents": docs}, headers=auth("service"))
    again = gw.client.get(f"/admin/usage?team_id={TEAM}", headers=auth("owner")).json()
    assert again["totals"][TEAM]["tokens"] == expected
    member = gw.client.get(f"/admin/usage?team_id={TEAM}", headers=auth("member"))
    assert member.status_code == 403
    everyone = gw.client.get("/admin/usage", headers=auth("owner"))
    assert everyone.status_code == 403  # every team needs the audit:read permission
    ops = gw.client.get("/admin/usage", headers=auth(permissions=["audit:read"]))
    assert ops.status_code == 200 and TEAM in ops.json()["totals"]
    bad = gw.client.get(
        f"/admin/usage?team_id={TEAM}&since=2026-12-02&until=2026-12-01", headers=auth("owner")
    )
    assert bad.status_code == 422 and bad.json()["fields"][0]["field"] == "since"


def _doc(raw):
    from batch_ingest.documents import SourceDocument

    return SourceDocument.model_validate(raw)


def test_concurrent_writers_add_up_exactly(tmp_path):
    url = f"sqlite:///{tmp_path / 'state.db'}"
    usage = EmbeddingUsage(SourceStore(url).engine)

    def writer(source: str) -> None:
        other = EmbeddingUsage(SourceStore(url).engine)  # another process's own engine
        for _ in range(20):
            other.add(source, {"t1": (10, 1), "t2": (3, 1)})

    threads = [threading.Thread(target=writer, args=(s,)) for s in ("api", "bus", "api")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = {(r.team_id, r.source): (r.tokens, r.chunks) for r in usage.rows()}
    assert rows == {
        ("t1", "api"): (400, 40),
        ("t2", "api"): (120, 40),
        ("t1", "bus"): (200, 20),
        ("t2", "bus"): (60, 20),
    }


def test_the_cli_prints_the_ledger(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'state.db'}"
    EmbeddingUsage(SourceStore(url).engine).add("bus", {"t1": (7, 2)})
    assert main(["--state-url", url, "--team", "t1"]) == 0
    assert '"tokens": 7' in capsys.readouterr().out


def test_the_consumer_pipeline_meters_as_bus(tmp_path):
    from batch_ingest.documents import SourceDocument
    from batch_ingest.pipeline import build_pipeline
    from batch_ingest.settings import BatchSettings
    from deployments.protocols import Backends
    from deployments.testing.fakes import FakeEmbedder, FakeVectorStore

    sources = SourceStore(f"sqlite:///{tmp_path / 'state.db'}")
    pipeline = build_pipeline(
        BatchSettings(),
        Backends(embedder=FakeEmbedder(dim=8), store=FakeVectorStore(), graph=None),
        count_tokens=whitespace_tokens,
        sources=sources,
        usage_source="bus",
    )
    doc = SourceDocument(team_id="t9", doc_id="x", text="one two three four")
    asyncio.run(pipeline.ingest([doc]))
    (row,) = EmbeddingUsage(sources.engine).rows("t9")
    assert (row.source, row.tokens, row.chunks) == ("bus", 4, 1)
