"""Scaling the Embedder on the texts it holds, not on its requests (opt-in: docs/operations.md,
"Scaling the Embedder on queued texts").

One Embedder request carries anywhere from one query to a few hundred passages, so Serve's
default policy (ongoing requests per replica) cannot tell a bulk load from a trickle. Each
Embedder replica reports the texts waiting in or running through its batch queues
(``record_autoscaling_stats``, deployments/models/embedder.py: ``backlog_metrics``), and
``queued_texts_policy`` asks for ``ceil(queued texts / target texts per replica)`` replicas.

Ray 2.60's hooks (ray/serve/config.py, ray/serve/autoscaling_policy.py,
ray/serve/_private/autoscaling_state.py):
- a replica's ``record_autoscaling_stats()`` returns ``{name: number}``; while its deployment
  has an ``autoscaling_config`` the replica calls it every ``look_back_period_s`` x 0.2 s (at
  most every ``metrics_interval_s``) and pushes the series to the controller every
  ``metrics_interval_s``;
- ``autoscaling_config.policy.policy_function: "module:function"`` names the policy; the
  controller calls it every control-loop tick with an ``AutoscalingContext``, whose
  ``aggregated_metrics[name][replica_id]`` is each running replica's series reduced over
  ``look_back_period_s`` by ``aggregation_function`` (mean by default);
- Ray wraps the policy (``_apply_autoscaling_config``): ``upscaling_factor`` /
  ``downscaling_factor``, ``upscale_delay_s`` / ``downscale_delay_s`` apply as they do to the
  default policy, and the result is clipped to ``min_replicas`` / ``max_replicas`` (adjusted
  for ``target_capacity``).

The target per replica is the deployment's ``target_ongoing_requests``, read as texts: it
stays tunable in place, whereas anything inside ``policy`` (``policy_kwargs`` too) is part of
the application's code version, and changing it rebuilds the whole application.

Ray pickles this module by value into the controller (``register_pickle_by_value``): it
imports nothing but the standard library, so the controller needs none of the gateway.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

# The import path for serve_config.yaml's ``autoscaling_config.policy.policy_function``.
POLICY = "deployments.models.autoscale:queued_texts_policy"
# Names of the metrics an Embedder replica reports; the policy reads QUEUED_TEXTS.
QUEUED_TEXTS = "queued_texts"
QUEUED_PASSAGES = "queued_passages"
QUEUED_QUERIES = "queued_queries"


def backlog_metrics(passages: int, queries: int) -> dict[str, float]:
    """What an Embedder replica reports: texts waiting in or running through its batch
    queues, in all and per kind."""
    return {
        QUEUED_TEXTS: float(passages + queries),
        QUEUED_PASSAGES: float(passages),
        QUEUED_QUERIES: float(queries),
    }


def replicas_for(
    queued_texts: float, texts_per_replica: float, min_replicas: int, max_replicas: int
) -> int:
    """``ceil(queued_texts / texts_per_replica)``, within ``[min_replicas, max_replicas]``."""
    wanted = math.ceil(queued_texts / texts_per_replica) if queued_texts > 0 else 0
    return max(min_replicas, min(max_replicas, wanted))


def queued_texts_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    """Ray Serve custom autoscaling policy: replicas for the texts the running replicas hold,
    ``autoscaling_config.target_ongoing_requests`` texts each. No replica has reported yet
    (just started, or a deployment without ``record_autoscaling_stats``): the current target
    stays."""
    per_replica = (ctx.aggregated_metrics or {}).get(QUEUED_TEXTS)
    if not per_replica or ctx.config is None:
        return ctx.target_num_replicas, {}
    texts_per_replica = float(ctx.config.get_target_ongoing_requests())
    desired = replicas_for(
        sum(per_replica.values()),
        texts_per_replica,
        ctx.capacity_adjusted_min_replicas,
        ctx.capacity_adjusted_max_replicas,
    )
    return desired, {}
