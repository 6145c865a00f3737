"""ONNX int8 variants of the embedder side by side on real text (issue 36): which ONNX Runtime
quantisation keeps the vectors closest to torch fp32 at int8 speed.

    .venv/bin/python -m bench.bench_int8 [--rounds 3] [--threads 1] [--extra] [--only REGEX]

Every variant is built from the fp32 file that ``deployments.models.onnx_encoder.export`` writes
(the ONNX backend's own export) into a temporary folder, never the model cache:

* dynamic (``quantize_dynamic``: int8 weights, uint8 activations quantised per call):
  per-tensor weights; per-channel weights (the shipped ``quantize: int8``), also without the
  FFN down-projection of layer 0 (``nodes_to_exclude``); MatMuls only
  (``op_types_to_quantize=["MatMul"]``: the embedding tables' Gathers stay fp32); the same
  with 7-bit weights (``reduce_range``); the same without some MatMuls (``nodes_to_exclude``):
  the FFN down-projections (``layer.N/output/dense``) of every layer, of layer 0 only, of
  layers 0-2, or every MatMul of the first and last layer (with ``--extra`` also only the FFN
  MatMuls, ``nodes_to_quantize``). Dynamic mode quantises only MatMuls with a constant B
  (``MatMulConstBOnly`` is True there by default): the attention-score MatMuls stay fp32.
* static QDQ (``quantize_static``, ``QuantFormat.QDQ``, per-channel int8 weights, uint8
  activations, MatMuls only, ``MatMulConstBOnly``) after ``quant_pre_process`` (ONNX Runtime's
  recommended shape inference; this graph needs ``auto_merge=True``): MinMax ranges with the
  MatMuls' outputs quantised too (the quantiser's default), and with them left fp32
  (``OpTypesToExcludeOutputQuantization=["MatMul"]``) for MinMax and Percentile (99.999).
  With ``--extra`` also Entropy (through ``create_calibrator`` with 2,048 histogram bins and a
  calibration cache: ``quantize_static`` always uses 128 bins and 128 quantised bins, with
  which the entropy search has one candidate and equals MinMax), int8 activations, and every
  op type the QDQ quantiser knows.
  Calibration text, never the evaluation text: 256 windows of 128 tokens of the King James
  Bible (Debian ``sword-text-kjv`` via ``bench.quality.bible_set``), each from a verse drawn
  with a fixed seed onwards, 8 batches of 32. No padding: the histogram calibrators (Entropy,
  Percentile) stack every batch into one array, so all batches need one shape.

Evaluation: the AppStream labeled set (bench/quality/appstream_set.py), as in bench_onnx: its
2,126 descriptions as passages, its component summaries as queries. Per variant: cosine of
every passage vector to torch fp32's (min, mean), nDCG@10 of exact dense retrieval over the
whole set, file size (MB = 10^6 bytes), and, interleaved over ``--rounds`` (each round runs
every variant once, the order rotated), medians of one query's embedding time (p50 over 100
queries) and passages/s at ``forward_batch_size`` 32 (256 passages). Tokenisation and pooling
are ``EmbedderCore``'s own: one ONNX core whose session is swapped per variant. The quality
pass runs with ``--quality-threads`` intra-op threads, the timing with ``--threads``. Writes
``bench/results/int8-<UTC>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_onnx import ndcg
from bench.common import environment_info, setup_logging, write_result
from bench.realtext import appstream
from deployments.config import EmbedderSettings
from deployments.models.embedding import EmbedderCore
from deployments.models.onnx_encoder import OnnxEncoder, export

logger = logging.getLogger("bench.int8")

SEED = 13
CALIBRATION_TEXTS = 256
CALIBRATION_BATCH = 32
CALIBRATION_TOKENS = 128
LAYER = re.compile(r"/layer\.(\d+)/")
FFN_DOWN = re.compile(r"/layer\.\d+/output/dense/MatMul$")
FFN_UP = re.compile(r"/layer\.\d+/intermediate/dense/MatMul$")


@dataclass
class Variant:
    """One way to run the encoder: ``torch``, ``fp32`` (the ONNX export as is), ``dynamic``
    or ``static`` (``args``: the quantiser's keyword arguments; ``calibrator``: when set, the
    ranges come from ``create_calibrator`` with these options, through a calibration cache,
    as ``quantize_static`` cannot set the histogram's bins itself)."""

    name: str
    method: str
    args: dict[str, Any] = field(default_factory=dict)
    calibrator: dict[str, Any] = field(default_factory=dict)
    extra: bool = False
    path: Path | None = None
    build_s: float = 0.0


def node_groups(path: Path) -> dict[str, list[str]]:
    """Names of the graph's MatMuls with a constant weight, by role."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    consts = {i.name for i in graph.initializer}
    weights = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in consts]

    def layer(name: str) -> int:
        match = LAYER.search(name)
        return int(match.group(1)) if match else -1

    layers = sorted({layer(n) for n in weights} - {-1})
    ffn_down = [n for n in weights if FFN_DOWN.search(n)]
    return {
        "weights": weights,
        "ffn_down": ffn_down,
        "ffn_down_first": [n for n in ffn_down if layer(n) == layers[0]],
        "ffn_down_first_half": [n for n in ffn_down if layer(n) in layers[: len(layers) // 2]],
        "ffn": [n for n in weights if FFN_DOWN.search(n) or FFN_UP.search(n)],
        "edge_layers": [n for n in weights if layer(n) in (layers[0], layers[-1])],
    }


def variants(groups: dict[str, list[str]]) -> list[Variant]:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

    per_channel = {"weight_type": QuantType.QInt8, "per_channel": True}
    matmul = {**per_channel, "op_types_to_quantize": ["MatMul"]}
    qdq = {
        "quant_format": QuantFormat.QDQ,
        "per_channel": True,
        "activation_type": QuantType.QUInt8,
        "weight_type": QuantType.QInt8,
    }
    static = {**qdq, "op_types_to_quantize": ["MatMul"]}
    # The MatMul's output stays fp32 (it feeds the bias Add): only its inputs are quantised.
    fp32_out = {"MatMulConstBOnly": True, "OpTypesToExcludeOutputQuantization": ["MatMul"]}
    minmax = {"calibrate_method": CalibrationMethod.MinMax}
    return [
        Variant("torch fp32", "torch"),
        Variant("onnx fp32", "fp32"),
        Variant("dyn per-tensor", "dynamic", {"weight_type": QuantType.QInt8}),
        Variant("dyn per-channel (shipped)", "dynamic", per_channel),
        Variant(
            "dyn per-channel, excl. FFN down of layer 0",
            "dynamic",
            {**per_channel, "nodes_to_exclude": groups["ffn_down_first"]},
        ),
        Variant("dyn pc, MatMul only", "dynamic", matmul),
        Variant("dyn pc, MatMul only, reduce_range", "dynamic", {**matmul, "reduce_range": True}),
        Variant(
            "dyn pc, MatMul, excl. FFN down (all layers)",
            "dynamic",
            {**matmul, "nodes_to_exclude": groups["ffn_down"]},
        ),
        Variant(
            "dyn pc, MatMul, excl. FFN down of layer 0",
            "dynamic",
            {**matmul, "nodes_to_exclude": groups["ffn_down_first"]},
        ),
        Variant(
            "dyn pc, MatMul, excl. FFN down of layers 0-2",
            "dynamic",
            {**matmul, "nodes_to_exclude": groups["ffn_down_first_half"]},
        ),
        Variant(
            "dyn pc, MatMul, excl. first+last layer",
            "dynamic",
            {**matmul, "nodes_to_exclude": groups["edge_layers"]},
        ),
        Variant(
            "dyn pc, FFN MatMuls only",
            "dynamic",
            {**matmul, "nodes_to_quantize": groups["ffn"]},
            extra=True,
        ),
        Variant(
            "static MinMax",
            "static",
            {**static, **minmax, "extra_options": {"MatMulConstBOnly": True}},
        ),
        Variant(
            "static MinMax, fp32 out", "static", {**static, **minmax, "extra_options": fp32_out}
        ),
        Variant(
            "static Entropy, fp32 out",
            "static",
            {**static, "calibrate_method": CalibrationMethod.Entropy, "extra_options": fp32_out},
            calibrator={"num_bins": 2048, "num_quantized_bins": 128},
            extra=True,
        ),
        Variant(
            "static Percentile, fp32 out",
            "static",
            {**static, "calibrate_method": CalibrationMethod.Percentile, "extra_options": fp32_out},
        ),
        Variant(
            "static MinMax, fp32 out, int8 act.",
            "static",
            {**static, **minmax, "activation_type": QuantType.QInt8, "extra_options": fp32_out},
            extra=True,
        ),
        Variant("static MinMax, all op types", "static", {**qdq, **minmax}, extra=True),
    ]


def calibration_batches(core: EmbedderCore, inputs: list[str]) -> list[dict[str, np.ndarray]]:
    """``CALIBRATION_TEXTS`` windows of ``CALIBRATION_TOKENS`` tokens of KJV text (from a
    verse drawn with ``SEED`` on), in batches of ``CALIBRATION_BATCH``: no padding, every
    batch of one shape (the histogram calibrators stack all batches into one array)."""
    from bench.quality.bible_set import KJV_MODULE, export_module

    verses = list(export_module(KJV_MODULE).values())
    rng = random.Random(SEED)
    windows: list[Any] = []
    while len(windows) < CALIBRATION_TEXTS:
        start = rng.randrange(len(verses) - 24)
        ids = core._tokenizer(
            " ".join(verses[start : start + 24]),
            truncation=True,
            max_length=CALIBRATION_TOKENS,
            return_tensors="np",
        )
        if ids["input_ids"].shape[1] == CALIBRATION_TOKENS:
            windows.append(ids)
    return [
        {
            n: np.concatenate([w[n] for w in windows[i : i + CALIBRATION_BATCH]]).astype(np.int64)
            for n in inputs
        }
        for i in range(0, len(windows), CALIBRATION_BATCH)
    ]


def build(variant: Variant, fp32: Path, folder: Path, batches: list[dict]) -> None:
    """Write ``variant``'s model into ``folder`` (sets ``path`` and ``build_s``)."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_dynamic, quantize_static
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter(batches)

        def get_next(self) -> dict | None:
            return next(self._batches, None)

    if variant.method == "fp32":
        variant.path = fp32
        return
    started = time.perf_counter()
    out = folder / (re.sub(r"[^a-z0-9]+", "-", variant.name.lower()).strip("-") + ".onnx")
    # The shape inference leaves temporary files in the working directory.
    with contextlib.chdir(folder):
        if variant.method == "dynamic":
            quantize_dynamic(fp32, out, **variant.args)
        else:
            pre = folder / "preprocessed.onnx"
            if not pre.exists():
                # Symbolic shape inference stops short on this graph without auto_merge.
                quant_pre_process(fp32, pre, auto_merge=True)
            args = dict(variant.args)
            reader: Reader | None = Reader()
            if variant.calibrator:
                calibrator = create_calibrator(
                    pre,
                    args["op_types_to_quantize"],
                    augmented_model_path=str(folder / "augmented.onnx"),
                    calibrate_method=args["calibrate_method"],
                    extra_options=variant.calibrator,
                )
                calibrator.collect_data(Reader())
                cache = folder / f"{out.stem}.calibration.json"
                save_tensors_data(calibrator.compute_data(), cache)
                args["calibration_cache_path"] = cache
                reader = None
            quantize_static(pre, out, reader, **args)
    variant.path = out
    variant.build_s = time.perf_counter() - started
    logger.info("built %s in %.1fs (%.1f MB)", variant.name, variant.build_s, size_mb(out))


def size_mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def describe(args: dict[str, Any]) -> dict[str, Any]:
    """The quantiser's arguments for the JSON (enums by name, node lists in full)."""
    return {k: getattr(v, "name", v) for k, v in args.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads while timed")
    p.add_argument("--quality-threads", type=int, default=2, help="threads of the quality pass")
    p.add_argument("--batch-texts", type=int, default=256, help="passages per throughput run")
    p.add_argument("--only", default="", help="regex: only these variants (and the fp32 ones)")
    p.add_argument(
        "--extra",
        action="store_true",
        help="also the variants that lost in exploration (FFN only, Entropy, int8 act., all ops)",
    )
    args = p.parse_args(argv)
    setup_logging()
    import torch

    labeled = appstream("bench_int8")
    docs = [d["text"] for d in labeled.documents]
    doc_ids = [d["doc_id"] for d in labeled.documents]
    queries = list(labeled.queries.values())
    # Both spelled out: the defaults resolve to ONNX int8 for the packaged model.
    torch_core = EmbedderCore(
        EmbedderSettings(
            backend="transformers", quantize="none", torch_threads=args.quality_threads
        )
    )
    onnx_core = EmbedderCore(
        EmbedderSettings(backend="onnx", quantize="none", torch_threads=args.quality_threads)
    )
    onnx_core.start()
    fp32 = export(onnx_core.model_path)
    inputs = list(onnx_core._model.inputs)
    chosen = [
        v
        for v in variants(node_groups(fp32))
        if v.method in ("torch", "fp32") or (re.search(args.only, v.name) and args.extra >= v.extra)
    ]
    batches = calibration_batches(onnx_core, inputs)
    vectors: dict[str, np.ndarray] = {}
    qvecs: dict[str, np.ndarray] = {}
    timed: dict[str, OnnxEncoder] = {}
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp:
        for v in chosen:
            core = torch_core
            if v.method != "torch":
                build(v, fp32, Path(tmp), batches)
                assert v.path is not None
                onnx_core._model = OnnxEncoder(v.path, args.quality_threads)
                core = onnx_core
            started = time.perf_counter()
            vectors[v.name] = core.embed(docs)
            qvecs[v.name] = core.embed(queries, "query")
            logger.info("embedded with %s in %.1fs", v.name, time.perf_counter() - started)
            if v.path is not None:
                timed[v.name] = OnnxEncoder(v.path, args.threads)
        ref = vectors["torch fp32"]
        torch.set_num_threads(args.threads)
        timings: dict[str, dict[str, list[float]]] = {
            v.name: {"query_ms": [], "texts_s": []} for v in chosen
        }
        batch = docs[: args.batch_texts]
        for r in range(args.rounds):  # interleaved, the order rotated each round
            for v in chosen[r % len(chosen) :] + chosen[: r % len(chosen)]:
                core = torch_core
                if v.name in timed:
                    onnx_core._model = timed[v.name]
                    core = onnx_core
                per_query = []
                for q in queries[:100]:
                    started = time.perf_counter()
                    core.embed([q], "query")
                    per_query.append((time.perf_counter() - started) * 1000)
                timings[v.name]["query_ms"].append(statistics.median(per_query))
                started = time.perf_counter()
                core.embed(batch)
                timings[v.name]["texts_s"].append(len(batch) / (time.perf_counter() - started))
            logger.info("round %d of %d timed", r + 1, args.rounds)
        sizes = {v.name: round(size_mb(v.path), 1) for v in chosen if v.path is not None}
    result: dict[str, Any] = {
        "environment": environment_info(),
        "threads": args.threads,
        "quality_threads": args.quality_threads,
        "rounds": args.rounds,
        "only": args.only,
        "extra": args.extra,
        "passages": len(docs),
        "queries": len(queries),
        "calibration": {
            "windows": CALIBRATION_TEXTS,
            "tokens": CALIBRATION_TOKENS,
            "batch": CALIBRATION_BATCH,
            "seed": SEED,
            "source": "KJV (sword-text-kjv), windows from a random verse on, no padding",
        },
        "variants": {},
    }
    rows = []
    torch_rate = statistics.median(timings["torch fp32"]["texts_s"]) if args.rounds else 0.0
    for v in chosen:
        cos = (vectors[v.name] * ref).sum(axis=1)
        q_ms = statistics.median(timings[v.name]["query_ms"]) if args.rounds else float("nan")
        rate = statistics.median(timings[v.name]["texts_s"]) if args.rounds else float("nan")
        entry: dict[str, Any] = {
            "method": v.method,
            "args": describe(v.args),
            "calibrator": v.calibrator,
            "file_mb": sizes.get(v.name),
            "build_s": round(v.build_s, 1),
            "query_ms_p50": round(q_ms, 2),
            "texts_per_s": round(rate, 1),
            "batch_speedup": round(rate / torch_rate, 2) if torch_rate else None,
            "cosine_to_torch_min": round(float(cos.min()), 5),
            "cosine_to_torch_mean": round(float(cos.mean()), 5),
            "ndcg10": round(ndcg(vectors[v.name], doc_ids, qvecs[v.name], labeled), 4),
            "rounds": timings[v.name],
        }
        result["variants"][v.name] = entry
        rows.append(
            f"| {v.name} | {entry['cosine_to_torch_min']} / {entry['cosine_to_torch_mean']} | "
            f"{entry['ndcg10']} | {q_ms:.2f} | {rate:.1f} ({entry['batch_speedup']}x) | "
            f"{entry['file_mb'] or '-'} |"
        )
    path = write_result("int8", result)
    columns = ["variant", "cosine to torch min / mean", "nDCG@10 AppStream"]
    columns += ["one query p50 ms", "passages/s (batch 32)", "file MB"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    print("\n".join(rows))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
