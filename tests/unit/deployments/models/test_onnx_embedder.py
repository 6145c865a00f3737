"""The ONNX Runtime backend of the embedder (issue 36): exported locally from the packaged
MiniLM, fp32 gives torch's vectors on padded batches of real text and shares its tag; int8
carries its own tag; the export is cached and redone when the model changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from batch_ingest.load_jsonl import SAMPLE
from deployments.config import EmbedderSettings
from deployments.models import onnx_encoder
from deployments.models.embedding import EmbedderCore, default_model_path


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory) -> Path:
    """The packaged model in a folder of its own (its export cache goes beside it)."""
    folder = tmp_path_factory.mktemp("minilm") / "all-MiniLM-L6-v2"
    shutil.copytree(default_model_path(), folder, ignore=shutil.ignore_patterns("onnx"))
    return folder


@pytest.fixture(scope="module")
def texts() -> list[str]:
    docs = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines() if line.strip()]
    # Mixed lengths in one forward batch: padding inside every batch.
    return docs + [d[:30] for d in docs] + ["solar", "who runs the cold store in winter?"]


def core(path: Path, **kw) -> EmbedderCore:
    c = EmbedderCore(EmbedderSettings(model_path=str(path), forward_batch_size=16, **kw))
    c.start()
    return c


def test_fp32_onnx_gives_torchs_vectors_under_the_same_tag(model_copy, texts):
    torch_core, onnx_core = core(model_copy), core(model_copy, backend="onnx")
    for kind in ("passage", "query"):
        cos = (torch_core.embed(texts, kind) * onnx_core.embed(texts, kind)).sum(axis=1)
        assert cos.min() >= 0.9999, cos.min()
    assert onnx_core.settings.embed_model_tag == torch_core.settings.embed_model_tag
    assert onnx_core.dim == torch_core.dim == 384
    assert onnx_core.count_tokens("the cold store") == torch_core.count_tokens("the cold store")


def test_int8_has_its_own_tag_and_stays_close(model_copy, texts):
    fp32, int8 = core(model_copy, backend="onnx"), core(model_copy, backend="onnx", quantize="int8")
    assert int8.settings.embed_model_tag == "all-MiniLM-L6-v2@v1+int8"
    cos = (fp32.embed(texts) * int8.embed(texts)).sum(axis=1)
    assert cos.mean() >= 0.98 and np.isfinite(cos).all()


def test_an_int8_vector_does_not_depend_on_the_texts_batched_with_it(model_copy, texts):
    """Dynamic quantisation scales activations over a whole forward pass: int8 runs one
    text per pass, so a text's vector is the same alone or beside any others."""
    int8 = core(model_copy, backend="onnx", quantize="int8")
    together = int8.embed([*texts, "a much longer passage " * 40])
    alone = np.stack([int8.embed([t])[0] for t in texts])
    assert np.array_equal(together[: len(texts)], alone)


def test_the_export_is_cached_and_redone_when_the_model_changes(model_copy):
    first = onnx_encoder.export(model_copy)
    stamp = first.stat().st_mtime_ns
    assert onnx_encoder.export(model_copy) == first and first.stat().st_mtime_ns == stamp
    assert first.parent.parent == model_copy / "onnx"
    config = model_copy / "config.json"
    config.write_text(config.read_text() + "\n")  # the model's files changed
    again = onnx_encoder.export(model_copy)
    assert again != first and again.exists()


def test_quantize_needs_the_onnx_backend():
    with pytest.raises(ValidationError, match="quantize needs embedder.backend onnx"):
        EmbedderSettings(backend="transformers", quantize="int8")


# Exports the model (int8) in a fresh process and prints how many exports it ran itself and
# which of torch's compiler modules it holds afterwards (torch.onnx loads them; the export's
# child must keep them).
EXPORT_AND_LIST = """
import sys
from deployments.models import onnx_encoder
ran = []
real = onnx_encoder._export_fp32
onnx_encoder._export_fp32 = lambda *a: (ran.append(1), real(*a))
onnx_encoder.export(sys.argv[1], "int8")
print(len(ran))
print(sorted(m for m in ("triton", "torch._dynamo", "torch.onnx") if m in sys.modules))
"""


def test_two_processes_exporting_at_once_leave_one_whole_file(tmp_path):
    """The Embedder and the Ingress replicas load the model at once on a fresh machine: one
    exports while the other waits for its file (one export in all), and no partial file
    stays. Neither replica keeps torch's compiler stack afterwards (the export runs in a
    child of its own; in the replica, triton's bindings crashed the process's exit)."""
    import subprocess
    import sys

    folder = tmp_path / "all-MiniLM-L6-v2"
    shutil.copytree(default_model_path(), folder, ignore=shutil.ignore_patterns("onnx"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", EXPORT_AND_LIST, str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    exports = 0
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"exit {p.returncode}: {out[-1000:]} {err[-3000:]}"
        *_, ran, modules = out.strip().splitlines()
        assert modules == "[]", out
        exports += int(ran)
    assert exports == 1
    # The int8 file is quantised from the fp32 export's own folder: one export for both.
    caches = sorted(f for f in (folder / "onnx").iterdir() if f.is_dir())
    assert sorted(sorted(f.name for f in c.iterdir()) for c in caches) == [
        ["model.int8.onnx"],
        ["model.onnx"],
    ]
    c = core(folder, backend="onnx", quantize="int8")
    assert c.embed(["the cold store"]).shape == (1, 384)


def test_a_failed_export_names_the_model_and_the_reason(tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"ONNX export of .*not-a-model failed \(exit 1\): .+"):
        onnx_encoder.export(folder)
    assert not list((folder / "onnx").rglob("*.onnx*"))


def test_threads_zero_is_the_cores_of_the_node(monkeypatch, tmp_path):
    import os

    from deployments import config

    quota_of = config._cgroup_cpus
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)), raising=False)
    monkeypatch.setattr(config, "_cgroup_cpus", lambda: None)
    assert EmbedderSettings(torch_threads=0).threads == 64
    # A pod limited to 2.5 CPUs on a 64-core host: 3 threads, not 64.
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert quota_of(str(tmp_path / "cpu.max")) == 3
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert quota_of(str(tmp_path / "cpu.max")) is None
    monkeypatch.setattr(config, "_cgroup_cpus", lambda: 3)
    assert EmbedderSettings(torch_threads=0).threads == 3
    assert EmbedderSettings(torch_threads=5).threads == 5
    with pytest.raises(ValidationError):
        EmbedderSettings(torch_threads=-1)


def test_onnx_on_a_gpu_device_is_refused_naming_both():
    with pytest.raises(ValidationError, match="backend onnx runs on the CPU.*device cuda"):
        EmbedderSettings(backend="onnx", device="cuda")


def test_the_embedder_replica_lowers_its_priority_only_on_a_cpu(monkeypatch):
    import os

    from deployments.models import embedder

    calls: list[int] = []
    # deployments.priority.lower_priority: every thread of the process
    # (tests/unit/batch_ingest/reindex/test_reindex.py).
    monkeypatch.setattr(embedder, "lower_priority", lambda n: calls.append(n) or 15 + n)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 15)
    assert embedder._lower_priority(EmbedderSettings(nice=4)) == 19
    assert embedder._lower_priority(EmbedderSettings()) == 15
    assert embedder._lower_priority(EmbedderSettings(nice=4, device="cuda")) == 15
    assert calls == [4]


@pytest.mark.parametrize("max_length", [256, 12])
def test_the_rust_tokenizer_call_gives_what_transformers_gives(texts, max_length):
    """The ONNX backend tokenizes with the fast tokenizer's own ``tokenizers.Tokenizer``
    (``batch_tokenizer``): the same ids, masks and types as the ``transformers`` call,
    padded batches and truncated texts included, and the ``transformers`` tokenizer's own
    settings left as they were."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    call = onnx_encoder.batch_tokenizer(tokenizer, max_length)
    long = " ".join(texts)  # past any max_length: truncated
    for batch in ([texts[0]], texts[:7], [long, "solar"], ["", "x"], ["naïve café — 東京"]):
        want = tokenizer(
            batch, padding=True, truncation=True, max_length=max_length, return_tensors="np"
        )
        got = call(batch)
        assert set(got) == set(want)
        for name, array in got.items():
            assert array.dtype == np.int64
            np.testing.assert_array_equal(array, want[name], err_msg=name)
        assert got["input_ids"].shape[1] <= max_length
