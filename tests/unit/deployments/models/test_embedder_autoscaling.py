"""Scaling the Embedder on queued texts (issue 36; docs/operations.md "Scaling the Embedder on
queued texts"): the policy (deployments/models/autoscale.py) and the count each replica
reports (``EmbedderDeployment.backlog``, ``record_autoscaling_stats``). The deployment scaling
under Serve: tests/serve/test_embedder_autoscaling_serve.py."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

from deployments.config import EmbedderSettings
from deployments.models.autoscale import (
    POLICY,
    QUEUED_PASSAGES,
    QUEUED_QUERIES,
    QUEUED_TEXTS,
    queued_texts_policy,
    replicas_for,
)
from deployments.models.embedder import EmbedderDeployment
from deployments.models.embedder_models import EmbedderModels
from deployments.protocols import Encoded
from deployments.timing import MeanTimes

ROOT = Path(__file__).resolve().parents[4]


# --- the policy ------------------------------------------------------------------------------
def ctx(
    queued: dict[str, float] | None,
    *,
    target: int = 1,
    per_replica: float = 100,
    low: int = 1,
    high: int = 4,
    metric: str = QUEUED_TEXTS,
) -> Any:
    """An ``AutoscalingContext`` stand-in with the fields the policy reads."""
    metrics = None if queued is None else {metric: queued}
    return SimpleNamespace(
        aggregated_metrics=metrics,
        target_num_replicas=target,
        capacity_adjusted_min_replicas=low,
        capacity_adjusted_max_replicas=high,
        config=SimpleNamespace(get_target_ongoing_requests=lambda: per_replica),
    )


def test_a_backlog_asks_for_one_replica_per_target_texts():
    assert queued_texts_policy(ctx({"r1": 300.0})) == (3, {})
    assert queued_texts_policy(ctx({"r1": 301.0})) == (4, {})
    # Summed over the replicas that reported.
    assert queued_texts_policy(ctx({"r1": 150.0, "r2": 60.0}, target=2)) == (3, {})
    assert queued_texts_policy(ctx({"r1": 100.0}, per_replica=64)) == (2, {})


def test_an_idle_deployment_scales_down_to_its_minimum():
    assert queued_texts_policy(ctx({"r1": 0.0, "r2": 0.0, "r3": 0.0}, target=3)) == (1, {})
    assert queued_texts_policy(ctx({"r1": 0.0, "r2": 0.0}, target=2, low=2)) == (2, {})
    assert queued_texts_policy(ctx({"r1": 40.0, "r2": 0.0}, target=2)) == (1, {})


def test_the_replicas_stay_within_min_and_max():
    assert queued_texts_policy(ctx({"r1": 10_000.0}, high=4)) == (4, {})
    assert queued_texts_policy(ctx({"r1": 1.0}, low=2, high=4)) == (2, {})
    assert replicas_for(0.0, 64, 0, 3) == 0  # min_replicas 0: scale to zero when idle
    assert replicas_for(1e-9, 64, 0, 3) == 1


def test_without_metrics_the_current_target_stays():
    assert queued_texts_policy(ctx(None, target=3)) == (3, {})
    assert queued_texts_policy(ctx({}, target=2)) == (2, {})
    # Another deployment's metric (no record_autoscaling_stats of ours): nothing to go by.
    assert queued_texts_policy(ctx({"r1": 999.0}, target=2, metric="other")) == (2, {})


def _ray_context(queued: float, target: int, config: Any, state: dict[str, Any]) -> Any:
    from ray.serve._private.common import DeploymentID
    from ray.serve.config import AutoscalingContext

    return AutoscalingContext(
        deployment_id=DeploymentID(name="Embedder", app_name="rag"),
        deployment_name="Embedder",
        app_name="rag",
        current_num_replicas=target,
        target_num_replicas=target,
        running_replicas=[],
        total_num_requests=1.0,
        total_queued_requests=0.0,
        aggregated_metrics=lambda: {QUEUED_TEXTS: {"r1": queued}},
        raw_metrics=None,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state=state,
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=time.time(),
        config=config,
    )


def test_ray_loads_the_policy_by_its_path_and_applies_its_delays():
    """The policy as Ray 2.60's controller runs it: imported from the path serve_config.yaml
    names, wrapped with the config's delays (``_apply_autoscaling_config``, private to Ray)."""
    from ray.serve.autoscaling_policy import _apply_autoscaling_config
    from ray.serve.config import AutoscalingConfig

    def config(**delays: float) -> AutoscalingConfig:
        return AutoscalingConfig(
            min_replicas=1,
            max_replicas=2,
            target_ongoing_requests=64,
            policy={"policy_function": POLICY},
            **delays,
        )

    now = config(upscale_delay_s=0, downscale_delay_s=0)
    assert now.policy.policy_function == POLICY
    policy = _apply_autoscaling_config(now.policy.get_policy())
    assert policy(_ray_context(500.0, 1, now, {}))[0] == 2  # bounded by max_replicas
    assert policy(_ray_context(0.0, 2, now, {}))[0] == 1
    assert policy(_ray_context(64.0, 1, now, {}))[0] == 1
    # Delays: the first decision to scale waits for upscale_delay_s / downscale_delay_s.
    later = config(upscale_delay_s=30, downscale_delay_s=600)
    policy = _apply_autoscaling_config(later.policy.get_policy())
    decision, state = policy(_ray_context(500.0, 1, later, {}))
    assert decision == 1 and state  # counting towards the delay
    assert policy(_ray_context(0.0, 2, later, {}))[0] == 2


# --- the count a replica reports -------------------------------------------------------------
class StubCore:
    loaded = True

    def __init__(self, settings: EmbedderSettings) -> None:
        self.settings = settings


class GatedQueue:
    """A batch queue stand-in: each text waits for ``gate``; texts in ``fail`` then raise."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.gate = asyncio.Event()
        self.fail = fail
        self.seen: list[str] = []

    async def __call__(self, request: tuple[float, str, str]) -> Encoded:
        self.seen.append(request[1])
        await self.gate.wait()
        if request[1] in self.fail:
            raise RuntimeError(f"batch failed on {request[1]!r}")
        return Encoded(np.zeros((1, 2), dtype=np.float32))


def shell(passages: GatedQueue, queries: GatedQueue) -> EmbedderDeployment:
    settings = EmbedderSettings()
    out = EmbedderDeployment.__new__(EmbedderDeployment)  # no model load, no Ray batch queue
    out.models = EmbedderModels(settings)
    out.models.cores = {settings.embed_model_tag: StubCore(settings)}  # type: ignore[dict-item]
    out.core = out.models.primary
    out._timing = MeanTimes()
    out.backlog = {"passage": 0, "query": 0}
    out._embed_passages = passages  # type: ignore[method-assign]
    out._embed_queries = queries  # type: ignore[method-assign]
    return out


async def until(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0)


def test_queued_texts_are_counted_while_they_wait_and_released_after():
    passages, queries = GatedQueue(), GatedQueue()
    embedder = shell(passages, queries)

    async def run() -> list[dict[str, float]]:
        seen = [await embedder.record_autoscaling_stats()]
        bulk = asyncio.create_task(embedder.encode(["a", "b", "c"], "passage"))
        search = asyncio.create_task(embedder.encode(["q"], "query"))
        await until(lambda: len(passages.seen) == 3 and len(queries.seen) == 1)
        seen.append(await embedder.record_autoscaling_stats())
        queries.gate.set()
        await search
        seen.append(await embedder.record_autoscaling_stats())
        passages.gate.set()
        encoded = await bulk
        assert encoded.dense.shape == (3, 2)
        seen.append(await embedder.record_autoscaling_stats())
        return seen

    idle, both, passages_only, done = asyncio.run(run())
    zero = {QUEUED_TEXTS: 0, QUEUED_PASSAGES: 0, QUEUED_QUERIES: 0}
    assert idle == zero and done == zero
    assert both == {QUEUED_TEXTS: 4, QUEUED_PASSAGES: 3, QUEUED_QUERIES: 1}
    assert passages_only == {QUEUED_TEXTS: 3, QUEUED_PASSAGES: 3, QUEUED_QUERIES: 0}
    assert all(type(v) is float for v in both.values())  # what Ray accepts: int or float


def test_texts_of_a_failed_batch_leave_the_count():
    passages = GatedQueue(fail=frozenset({"b"}))
    embedder = shell(passages, GatedQueue())

    async def run() -> dict[str, float]:
        bulk = asyncio.create_task(embedder.encode(["a", "b", "c"], "passage"))
        await until(lambda: len(passages.seen) == 3)
        assert embedder.backlog == {"passage": 3, "query": 0}
        passages.gate.set()
        with pytest.raises(RuntimeError, match="batch failed"):
            await bulk
        await until(lambda: embedder.backlog["passage"] == 0)
        return await embedder.record_autoscaling_stats()

    assert asyncio.run(run())[QUEUED_TEXTS] == 0


def test_a_caller_that_gives_up_leaves_the_count():
    passages = GatedQueue()
    embedder = shell(passages, GatedQueue())

    async def run() -> None:
        call = asyncio.create_task(embedder.encode(["a"], "passage"))
        await until(lambda: embedder.backlog["passage"] == 1)
        call.cancel()  # Serve cancels a request whose client went away
        with pytest.raises(asyncio.CancelledError):
            await call
        assert embedder.backlog["passage"] == 0

    asyncio.run(run())


# --- the documented opt-in -------------------------------------------------------------------
def _shipped_app() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]


def _documented_entry() -> dict[str, Any]:
    """The shipped Embedder entry with the ``autoscaling_config`` that docs/operations.md
    gives for the queued-texts policy."""
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if POLICY in b]
    assert len(blocks) == 1, "one YAML block names the policy"
    block = yaml.safe_load(blocks[0])
    assert list(block) == ["autoscaling_config"]
    (shipped,) = [d for d in _shipped_app()["deployments"] if d["name"] == "Embedder"]
    return {**shipped, **block}


def _with_embedder(entry: dict[str, Any]) -> dict[str, Any]:
    app = _shipped_app()
    app["deployments"] = [entry if d["name"] == "Embedder" else d for d in app["deployments"]]
    return app


def _code_version(app: dict[str, Any]) -> str:
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    return get_app_code_version(ServeApplicationSchema.model_validate(app))


def test_the_documented_opt_in_is_a_valid_serve_config():
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    entry = _documented_entry()
    raw = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    raw["applications"] = [_with_embedder(entry)]
    ServeDeploySchema.model_validate(raw)
    config = AutoscalingConfig(**entry["autoscaling_config"])
    assert config.policy.policy_function == POLICY
    assert config.policy.get_policy().__name__ == queued_texts_policy.__name__
    assert config.look_back_period_s > config.metrics_interval_s


def test_the_shipped_config_keeps_serves_default_policy():
    (embedder,) = [d for d in _shipped_app()["deployments"] if d["name"] == "Embedder"]
    assert "policy" not in embedder["autoscaling_config"]


def test_turning_the_policy_on_rebuilds_the_app_and_tuning_it_after_does_not():
    entry = _documented_entry()
    opted_in = _code_version(_with_embedder(entry))
    assert opted_in != _code_version(_shipped_app())  # documented: every replica restarts
    for key, value in [("target_ongoing_requests", 512), ("max_replicas", 8)]:
        tuned = {**entry, "autoscaling_config": {**entry["autoscaling_config"], key: value}}
        assert _code_version(_with_embedder(tuned)) == opted_in, key
