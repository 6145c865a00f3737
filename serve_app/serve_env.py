"""Environment of the Ray processes that run the gateway: Ray Serve's own tuning flags.

One place for them: ``scripts/ray_local.sh`` and ``cluster.yaml`` export them before
``ray start`` (``python -m serve_app.serve_env`` prints the ``export`` lines),
``serve_config.yaml`` repeats them as the application's ``runtime_env`` (a unit test keeps
the two equal), and the benchmarks and the Serve tests set them before ``ray.init``.

* ``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``: deployment code runs on the replica's own
  event loop instead of a second loop in another thread (one of Ray Serve's
  throughput-optimised settings). On 2 cores it cut search_docs p50 by ~5 ms and raised
  throughput at concurrency 8 (bench/README.md, "Where a search's time goes"). Every
  blocking call of the deployments runs in a thread or is a bounded model call.
"""

from __future__ import annotations

SERVE_ENV: dict[str, str] = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
}


def main() -> int:
    for name, value in SERVE_ENV.items():
        print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
