"""The embedder's backends side by side on real text (issue 36): torch fp32, ONNX fp32, ONNX
int8 (dynamic, per-channel weights), in one process, runs interleaved, medians reported.

    .venv/bin/python -m bench.bench_onnx [--rounds 5] [--threads 1]

Data: the AppStream labeled set (bench/quality/appstream_set.py): its descriptions as
passages, its component summaries as queries. Per backend: one query's embedding time (p50
over the queries of a round), passages/s at ``forward_batch_size`` 32, cosine of every passage
vector to torch's (min, mean), and nDCG@10 of dense retrieval over the whole set (exact cosine,
numpy). Writes ``bench/results/onnx-<UTC>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from bench.common import environment_info, setup_logging, write_result
from bench.quality.metrics import ndcg_at_k
from bench.realtext import appstream
from deployments.config import EmbedderSettings
from deployments.models.embedding import EmbedderCore

VARIANTS = {
    "torch fp32": {"backend": "transformers"},
    "onnx fp32": {"backend": "onnx", "quantize": "none"},
    "onnx int8": {"backend": "onnx", "quantize": "int8"},
}


def ndcg(doc_vecs: np.ndarray, doc_ids: list[str], q_vecs: np.ndarray, labeled: Any) -> float:
    scores = q_vecs @ doc_vecs.T
    out = []
    for row, qid in zip(scores, labeled.queries, strict=True):
        top = np.argsort(-row)[:10]
        out.append(ndcg_at_k([doc_ids[i] for i in top], labeled.qrels.get(qid, {})))
    return float(np.mean(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of each backend")
    p.add_argument("--batch-texts", type=int, default=256, help="passages per throughput run")
    args = p.parse_args(argv)
    setup_logging()
    labeled = appstream("bench_onnx")
    docs = [d["text"] for d in labeled.documents]
    doc_ids = [d["doc_id"] for d in labeled.documents]
    queries = list(labeled.queries.values())
    cores = {
        name: EmbedderCore(EmbedderSettings(torch_threads=args.threads, **kw))
        for name, kw in VARIANTS.items()
    }
    for core in cores.values():
        core.start()
    # Quality: every passage and query once per backend.
    vectors = {name: core.embed(docs) for name, core in cores.items()}
    qvecs = {name: core.embed(queries, "query") for name, core in cores.items()}
    ref = vectors["torch fp32"]
    result: dict[str, Any] = {
        "environment": environment_info(),
        "threads": args.threads,
        "passages": len(docs),
        "queries": len(queries),
        "variants": {},
    }
    timings: dict[str, dict[str, list[float]]] = {n: {"query_ms": [], "texts_s": []} for n in cores}
    batch = docs[: args.batch_texts]
    for _ in range(args.rounds):  # interleaved: each round runs every backend once
        for name, core in cores.items():
            per_query = []
            for q in queries[:100]:
                started = time.perf_counter()
                core.embed([q], "query")
                per_query.append((time.perf_counter() - started) * 1000)
            timings[name]["query_ms"].append(statistics.median(per_query))
            started = time.perf_counter()
            core.embed(batch)
            timings[name]["texts_s"].append(len(batch) / (time.perf_counter() - started))
    base = {k: statistics.median(v) for k, v in timings["torch fp32"].items()}
    rows = []
    for name, core in cores.items():
        cos = (vectors[name] * ref).sum(axis=1)
        q = statistics.median(timings[name]["query_ms"])
        t = statistics.median(timings[name]["texts_s"])
        entry = {
            "tag": core.settings.embed_model_tag,
            "query_ms_p50": round(q, 2),
            "query_speedup": round(base["query_ms"] / q, 2),
            "texts_per_s": round(t, 1),
            "batch_speedup": round(t / base["texts_s"], 2),
            "cosine_to_torch_min": round(float(cos.min()), 5),
            "cosine_to_torch_mean": round(float(cos.mean()), 5),
            "ndcg10": round(ndcg(vectors[name], doc_ids, qvecs[name], labeled), 4),
            "rounds": timings[name],
        }
        result["variants"][name] = entry
        rows.append(
            f"| {name} | `{entry['tag']}` | {q:.2f} ms ({entry['query_speedup']}x) | "
            f"{t:.1f} ({entry['batch_speedup']}x) | {entry['cosine_to_torch_min']} / "
            f"{entry['cosine_to_torch_mean']} | {entry['ndcg10']} |"
        )
    path = write_result("onnx", result)
    columns = ["backend", "tag", "one query, p50", "passages/s (batch 32)"]
    columns += ["cosine to torch min / mean", "nDCG@10"]
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
