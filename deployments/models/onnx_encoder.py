"""The embedder's ONNX Runtime backend (``embedder.backend: onnx``, issue 36).

The encoder is exported locally from the same Hugging Face folder the ``transformers``
backend loads (nothing is downloaded), with ``torch.onnx`` from a padded batch and eager
attention (an export from one unpadded input gave padded batches cosine 0.936 to torch), its
output the last hidden state; pooling and normalisation stay in numpy, as for torch. The
export is cached on disk, in ``onnx/`` inside the model folder when that is writable, else
under ``var/onnx/``, keyed by the model's files (size and mtime) and the export settings, so a
changed model is exported again. ``quantize: int8`` adds ONNX Runtime's dynamic int8
quantisation of the exported graph (weights per channel, int8 matrix products); its vectors
drift from fp32, so it carries its own model tag (``EmbedderSettings.embed_model_tag``) and
never shares a collection with fp32 vectors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Bump when the export changes (a new cache key, so older exports are not reused).
EXPORT_VERSION = 1
OPSET = 17
ROOT = Path(__file__).resolve().parents[1]
# The folder holding the ``deployments`` package, for the export's child process.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
# How long one export may take (MiniLM ~10 s, bge-m3 a few minutes on 2 vCPUs).
EXPORT_TIMEOUT_S = 1800


def _fingerprint(model_path: Path, quantize: str) -> str:
    parts: list[Any] = [EXPORT_VERSION, OPSET, quantize]
    for f in sorted(model_path.iterdir()):
        if f.is_file():
            st = f.stat()
            parts.append((f.name, st.st_size, int(st.st_mtime)))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def cache_dir(model_path: Path, key: str) -> Path:
    """Where the export of ``model_path`` lives: beside the model if writable, else var/."""
    beside = model_path / "onnx" / key
    try:
        beside.mkdir(parents=True, exist_ok=True)
        probe = beside / ".write-test"
        probe.write_text("")
        probe.unlink()
        return beside
    except OSError:
        var = Path(os.environ.get("RAG_VAR_DIR", ROOT / "var"))
        fallback = var / "onnx" / f"{model_path.name}-{key}"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def export(model_path: str | Path, quantize: str = "none") -> Path:
    """The ONNX file of ``model_path`` (exported, and quantised, on first use).

    Raises:
        RuntimeError: the export or the quantisation failed (the message says which).
    """
    model_path = Path(model_path)
    folder = cache_dir(model_path, _fingerprint(model_path, quantize))
    target = folder / ("model.int8.onnx" if quantize == "int8" else "model.onnx")
    if target.exists():
        return target
    # One export per cache folder: the Embedder and the Ingress replicas (and every replica
    # of each) load the model at once on a fresh machine; the first exports, the others wait
    # for it and read its file (four replicas exporting side by side took ~100 s of CPU
    # from a 2-vCPU node's start). The lock file sits beside the folder; the OS releases it
    # when its holder dies.
    lock = FileLock(folder.with_name(folder.name + ".lock"))
    try:
        lock.acquire(timeout=EXPORT_TIMEOUT_S)
    except Timeout as exc:
        raise RuntimeError(
            f"ONNX export of {model_path}: another process held {lock.lock_file} "
            f"for over {EXPORT_TIMEOUT_S} s"
        ) from exc
    try:
        if target.exists():
            return target
        started = time.perf_counter()
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # Quantised from the fp32 export's own cache (exported first if missing): one
            # export serves both; the locks are always taken int8 first, then fp32.
            fp32 = export(model_path)
            partial = _partial(target)
            quantize_dynamic(fp32, partial, weight_type=QuantType.QInt8, per_channel=True)
            os.replace(partial, target)
        else:
            _export_fp32(model_path, target)
        logger.info("exported %s to %s in %.1fs", model_path, target, time.perf_counter() - started)
        return target
    finally:
        lock.release()


def _export_fp32(model_path: Path, out: Path) -> None:
    """Exports in a child process: ``torch.onnx`` loads torch's compiler stack (dynamo and
    triton's native module) even for the TorchScript exporter, and that stayed in the
    replica for its whole life (memory it never used again) and crashed its exit
    (triton's bindings report leaks and segfault at interpreter shutdown: a test process
    that had exported ended with exit 139 after all its tests passed).

    Raises:
        RuntimeError: the export failed; the message ends with the child's last output.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE_ROOT), env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(model_path), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=EXPORT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"ONNX export of {model_path} took over {EXPORT_TIMEOUT_S} s") from exc
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout or "").strip()[-2000:]
        raise RuntimeError(
            f"ONNX export of {model_path} failed (exit {done.returncode}): {tail or 'no output'}"
        )


def _export_fp32_here(model_path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path, attn_implementation="eager").eval()
    names = [n for n in INPUTS if n in tokenizer.model_input_names]

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, tensors, strict=True))).last_hidden_state

    sample = tokenizer(
        ["a short one", "a longer sample sentence, so that the batch is padded " * 3],
        padding=True,
        return_tensors="pt",
    )
    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    partial = _partial(out)
    with torch.inference_mode():
        torch.onnx.export(
            LastHidden().eval(),
            tuple(sample[n] for n in names),
            str(partial),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    os.replace(partial, out)


def _partial(target: Path) -> Path:
    """A file of this process beside ``target``, renamed into place when whole: the rename
    is atomic, so a reader (a process that did not take the export lock: an older version's,
    or one whose cache folder was copied mid-export) sees either no file or a whole one."""
    return target.with_name(f"{target.name}.{os.getpid()}.partial")


class OnnxEncoder:
    """An ONNX Runtime session over an exported encoder: token arrays → last hidden state.

    Args:
        path: the ``.onnx`` file; ``threads``: intra-op threads (the replica's cores).
    """

    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # No busy-waiting between runs: ONNX Runtime's threads otherwise spin after each
        # call and took the cores from the rest of the request (the searches' dense+bm25
        # stage 7 -> 50 ms at 8 concurrent searches on 2 vCPUs, bench/README.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.path = path

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        feed = {n: batch[n].astype(np.int64) for n in self.inputs}
        return np.asarray(self.session.run(None, feed)[0])


def batch_tokenizer(
    tokenizer: Any, max_length: int
) -> Callable[[list[str]], dict[str, np.ndarray]]:
    """``texts -> {input_ids, attention_mask, token_type_ids}`` as int64 arrays, padded to
    the longest and truncated at ``max_length``: what ``tokenizer(texts, padding=True,
    truncation=True, max_length=..., return_tensors="np")`` gives, straight from a fast
    tokenizer's own Rust ``tokenizers.Tokenizer`` (a copy, configured once). The
    ``transformers`` call around it re-applies its settings on every call: 44 against 20 µs
    for a query (bench/README.md, "Search plumbing, thirteenth pass"). A tokenizer without a
    Rust backend gets the ``transformers`` call."""

    def slow(texts: list[str]) -> dict[str, np.ndarray]:
        return dict(
            tokenizer(
                texts, padding=True, truncation=True, max_length=max_length, return_tensors="np"
            )
        )

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return slow
    from tokenizers import Tokenizer

    fast = Tokenizer.from_str(backend.to_str())
    fast.enable_truncation(
        max_length, direction=getattr(tokenizer, "truncation_side", "right") or "right"
    )
    fast.enable_padding(
        direction=getattr(tokenizer, "padding_side", "right") or "right",
        pad_id=int(tokenizer.pad_token_id or 0),
        pad_type_id=int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
        pad_token=str(tokenizer.pad_token or "[PAD]"),
    )

    def call(texts: list[str]) -> dict[str, np.ndarray]:
        encoded = fast.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
        }

    return call


if __name__ == "__main__":
    # The child of ``_export_fp32``: python -m deployments.models.onnx_encoder MODEL OUT
    # (os._exit: skip the interpreter's teardown, where triton's bindings crash).
    logging.basicConfig(level=logging.WARNING)
    _export_fp32_here(Path(sys.argv[1]), Path(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
