"""A change of embedding model through the deployed gateway (issue 33; docs/operations.md,
"Changing the embedding model"): an app serving the packaged all-MiniLM-L6-v2 (384-d) with
``embedder_next`` a tiny BERT built here (64-d, random weights, offline), deployed beside the
suite's apps on its 2 CPUs. Its Ingress embeds each query with both models, its Embedder
serves both, its Retriever searches the vector of the model of the version it pinned.

Before ``POST /admin/reindex`` the team's documents are found with MiniLM vectors; while
the job embeds them with the next model, searches keep answering; after the switch each
document is its own nearest dense neighbour under the new model, a document written after it
is embedded with the new model and found, and BM25 finds every marker."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from deployments.testing.tiny_models import build_tiny_embedder
from tests.serve.conftest import wait_ready

pytestmark = pytest.mark.serve

APP, PREFIX = "rag_mc", "/mc"


@pytest.fixture(scope="module")
def changing(gateway: str, run_id: str, tmp_path_factory: pytest.TempPathFactory):
    from ray import serve

    from serve_app.app import AppArgs, build_app

    tiny = build_tiny_embedder(tmp_path_factory.mktemp("tiny") / "tiny-embed", hidden=64)
    settings = {
        "milvus": {"collection": f"serve_{run_id}"},
        "cache": {"enabled": False},
        # A fourth app on the suite's 2 CPUs: its models ask for none, and its reindex
        # pool for a tenth (the suite's gateway holds most of them).
        "embedder": {"num_cpus": 0},
        "embedder_next": {
            "model_path": str(tiny),
            "model_name": "tiny-embed",
            "model_version": "v1",
            "num_cpus": 0,
        },
        "reindex": {"num_cpus_per_actor": 0.1},
    }
    serve.run(
        build_app(AppArgs(settings=settings, graph_enabled=False)), name=APP, route_prefix=PREFIX
    )
    base = gateway + PREFIX
    wait_ready(base)
    yield base
    serve.delete(APP)


def top(c: httpx.Client, team: str, text: str, mode: str) -> list[str]:
    r = c.post(
        "/rag/search_docs",
        json={"team_id": team, "query": text, "search_mode": mode, "top_k": 3},
    )
    assert r.status_code == 200, r.text
    return [m["source_ref"]["id"] for m in r.json()["matches"]]


def test_a_change_of_model_over_http(changing: str):
    team = f"dao_mc_{uuid.uuid4().hex[:6]}"
    docs = [
        {
            "team_id": team,
            "doc_id": f"m{i}",
            "text": f"Orchard {i} keeps its apple rootstock register; marker{i} is filed "
            f"under season {i % 4} with the pruning notes of row {i}.",
        }
        for i in range(12)
    ]
    with httpx.Client(base_url=changing, timeout=120) as c:
        r = c.post("/ingest/documents", json={"documents": docs})
        assert r.status_code == 200 and r.json()["indexed"] == 12, r.text
        for d in docs[:4]:  # MiniLM vectors: each document is its own nearest neighbour
            assert top(c, team, d["text"], "dense")[0] == d["doc_id"]

        r = c.post("/admin/reindex", json={"team_id": team})
        assert r.status_code == 202, r.text
        job_id, searches, deadline = r.json()["job_id"], 0, time.monotonic() + 400
        while True:
            assert top(c, team, docs[searches % 12]["text"], "hybrid")  # answers, 200
            searches += 1
            job = c.get(f"/admin/reindex/{job_id}").json()
            if job["status"] not in ("queued", "running", "switching"):
                break
            assert time.monotonic() < deadline, job
            time.sleep(0.3)
        assert job["status"] == "succeeded", job
        assert job["embed_model"] == "tiny-embed@v1"
        assert job["rows_in_target"] == job["expected_chunks"] == 12

        late = {
            "team_id": team,
            "doc_id": "late",
            "text": "A late note on the cider press: marker99 waits for the autumn audit.",
        }
        r = c.post("/ingest/documents", json={"documents": [late]})
        assert r.status_code == 200 and r.json()["indexed"] == 1, r.text
        for d in [*docs[:4], late]:  # the tiny model's vectors now, the late one's too
            assert top(c, team, d["text"], "dense")[0] == d["doc_id"]
        for d in [*docs, late]:
            marker = d["text"].split("marker")[1].split()[0]
            assert top(c, team, f"marker{marker}", "bm25")[0] == d["doc_id"]
    assert searches >= 2
