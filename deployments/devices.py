"""Where a model runs: the device a setting names (``cpu``, ``cuda``, ``cuda:N`` or
``auto``), the torch dtype it loads in, and the Ray resources its Serve replica asks for.

Ray hides every GPU from an actor that did not ask for one (``CUDA_VISIBLE_DEVICES`` is
empty), so a model configured for ``cuda`` must ask for ``num_gpus`` in its replica's
``ray_actor_options``; ``auto`` asks when the cluster has GPUs and then uses the one Ray
gives it. On CPU nothing changes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator

Dtype = Literal["float32", "float16", "bfloat16"]

DEVICE = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")


def check_device(value: str) -> str:
    """A settings validator: ``cpu``, ``auto``, ``cuda`` or ``cuda:N``."""
    if not DEVICE.match(value):
        raise ValueError(f"device must be cpu, auto, cuda or cuda:N, got {value!r}")
    return value


# A settings field naming a device (validated by ``check_device``).
Device = Annotated[str, AfterValidator(check_device)]


def cluster_gpus() -> float:
    """GPUs in the running Ray cluster (0 when Ray is not running or has none)."""
    try:
        import ray

        if not ray.is_initialized():
            return 0.0
        return float(ray.cluster_resources().get("GPU", 0.0))
    except Exception:
        return 0.0


def wants_gpu(device: str) -> bool:
    """Whether a replica for ``device`` asks Ray for a GPU: ``cuda*`` always, ``auto`` when
    the cluster has one."""
    if device.startswith("cuda"):
        return True
    return device == "auto" and cluster_gpus() > 0


def actor_options(device: str, num_cpus: float, num_gpus: float) -> dict[str, Any]:
    """``ray_actor_options`` of a model replica: ``num_gpus`` (fractional: several replicas
    share one GPU) only when it runs on a GPU."""
    options: dict[str, Any] = {"num_cpus": num_cpus}
    if wants_gpu(device):
        options["num_gpus"] = num_gpus
    return options


def resolve_device(device: str) -> str:
    """The torch device inside the replica: ``auto`` becomes ``cuda`` when torch sees a GPU
    (Ray gave it one), else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: Dtype, device: str) -> Any:
    """The dtype a model loads in. Half precision only on a GPU: on a CPU fp16 matmuls are
    slow or missing, so a CPU replica keeps float32 whatever is configured."""
    import torch

    if not device.startswith("cuda"):
        return torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def placement(device: str, dtype: Dtype) -> tuple[str, Any, str]:
    """Inside a replica: the resolved torch device, the torch dtype to load in and that
    dtype's name (``float32`` on a CPU)."""
    resolved = resolve_device(device)
    loaded = torch_dtype(dtype, resolved)
    return resolved, loaded, str(loaded).removeprefix("torch.")
