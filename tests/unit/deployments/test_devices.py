"""Model placement without a GPU: device names, Ray's num_gpus, dtypes and what the loaded
models report (deployments/devices.py)."""

from __future__ import annotations

import pytest
import torch

import deployments.devices as devices
from deployments.config import EmbedderSettings, RerankerSettings
from deployments.models.embedder import deployment_options as embedder_options
from deployments.models.embedding import EmbedderCore
from deployments.models.reranker import RerankerCore
from deployments.models.reranker import deployment_options as reranker_options


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "auto"])
def test_known_devices_are_accepted(device):
    assert EmbedderSettings(device=device).device == device
    assert RerankerSettings(device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "CUDA", "mps", ""])
def test_unknown_devices_are_refused_by_name(device):
    with pytest.raises(ValueError, match="device must be cpu, auto, cuda or cuda:N"):
        EmbedderSettings(device=device)


@pytest.mark.parametrize("num_gpus", [0, -1, 9])
def test_num_gpus_is_bounded(num_gpus):
    with pytest.raises(ValueError, match="num_gpus"):
        RerankerSettings(num_gpus=num_gpus)


@pytest.mark.parametrize(
    ("device", "cluster", "asks"),
    [
        ("cpu", 4, False),
        ("cuda", 0, True),
        ("cuda:0", 0, True),
        ("auto", 0, False),
        ("auto", 2, True),
    ],
)
def test_replicas_ask_ray_for_a_gpu_only_on_a_gpu(monkeypatch, device, cluster, asks):
    monkeypatch.setattr(devices, "cluster_gpus", lambda: float(cluster))
    embedder = embedder_options(EmbedderSettings(device=device, num_gpus=0.25))
    reranker = reranker_options(RerankerSettings(device=device, num_gpus=0.5))
    if asks:
        assert embedder["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.25}
        assert reranker["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 0.5}
    else:
        assert "num_gpus" not in embedder["ray_actor_options"]
        assert "num_gpus" not in reranker["ray_actor_options"]


def test_auto_device_embeds_queries_in_the_ingress_only_without_cluster_gpus(monkeypatch):
    monkeypatch.setattr(devices, "cluster_gpus", lambda: 0.0)
    assert EmbedderSettings(device="auto").queries_in_ingress
    monkeypatch.setattr(devices, "cluster_gpus", lambda: 1.0)
    assert not EmbedderSettings(device="auto").queries_in_ingress


def test_cluster_gpus_is_zero_without_ray():
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray session is running in this process")
    assert devices.cluster_gpus() == 0.0


def test_half_precision_applies_on_a_gpu_only():
    assert devices.torch_dtype("float16", "cuda") is torch.float16
    assert devices.torch_dtype("bfloat16", "cuda:1") is torch.bfloat16
    assert devices.torch_dtype("float16", "cpu") is torch.float32
    assert devices.torch_dtype("float32", "cuda") is torch.float32


def test_auto_resolves_to_what_torch_sees(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.resolve_device("auto") == "cuda"
    assert devices.resolve_device("cuda:1") == "cuda:1"


def test_embedder_on_auto_without_a_gpu_loads_float32_on_cpu_and_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    core = EmbedderCore(EmbedderSettings(device="auto", dtype="float16"))
    core.start()
    assert (core.device, core.dtype) == ("cpu", "float32")
    assert next(core._model.parameters()).dtype is torch.float32
    assert core.embed(["a sentence"]).shape == (1, 384)


def test_reranker_on_auto_without_a_gpu_loads_on_cpu(monkeypatch, tmp_path):
    from deployments.testing.tiny_models import build_tiny_cross_encoder

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = build_tiny_cross_encoder(tmp_path / "ce")
    core = RerankerCore(RerankerSettings(model_path=str(path), device="auto", dtype="bfloat16"))
    core.start()
    assert (core.device, core.dtype) == ("cpu", "float32")
    assert core.rerank("q", ["a", "b"]).shape == (2,)
