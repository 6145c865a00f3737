"""Start the whole gateway on a private local Ray cluster for a benchmark, then tear it down.

    with ServeHarness(port=8300, collection="bench_search") as h:
        httpx.get(h.url("/readyz"))
        embedder = h.embedder_handle()

``start()``:

* sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (node IP 127.0.0.1, core listeners on loopback)
  and ``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN_PATH`` pointing at a fresh random token in
  a private temp folder (so nothing is written to ``~/.ray``), and the shipped Ray Serve
  environment of ``deployments.serve_env`` (``bench.harness_env``);
* ``ray.init(address="local", include_dashboard=False, _temp_dir=<that folder>)``;
* ``serve.start`` with HTTP on ``127.0.0.1:<port>`` and ``serve.run(build_app(...))`` as app
  ``rag`` at ``/``, with the Milvus collection overridden to the benchmark's own;
* waits until ``GET /readyz`` answers 200 (model loaded, Milvus and Neo4j reachable).

``stop()`` shuts Serve and Ray down, drops the benchmark collection with
``MilvusStore.drop()``, deletes the benchmark tenants' nodes from Neo4j (ingestion MERGEs them
into the shared graph; both in ``bench.harness_stores``) and removes the temp folder (kept,
with Ray's logs, if startup failed).
Collection names must start with ``bench_`` so a benchmark can never drop someone else's.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx

from bench import harness_stores
from bench.harness_env import HarnessEnv

logger = logging.getLogger("bench.harness")

APP_NAME = "rag"
COLLECTION_PREFIX = "bench_"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def run_benchmark(
    name: str,
    harness: ServeHarness,
    result: dict[str, Any],
    run: Callable[[ServeHarness], Coroutine[Any, Any, dict[str, Any]]],
    render: Callable[[dict[str, Any]], str],
    out: str | None,
) -> dict[str, Any]:
    """Start ``harness``, add ``await run(harness)`` to ``result`` (the harness is stopped
    whatever happens), time it, render its table and write ``bench/results/<name>-*.json``.

    Returns:
        ``result`` with ``startup_s``, ``total_s`` and ``table_markdown``.
    """
    import asyncio

    from bench.common import write_result

    started = time.perf_counter()
    try:
        with harness:
            result["startup_s"] = harness.startup_s
            result.update(asyncio.run(run(harness)))
    finally:
        harness.stop()
    result["total_s"] = round(time.perf_counter() - started, 1)
    result["table_markdown"] = render(result)
    write_result(name, result, out)
    return result


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _raise_system_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


class ServeHarness:
    """The gateway app on a throw-away local Ray cluster.

    Args:
        port: HTTP port of the Serve proxy on 127.0.0.1.
        collection: Milvus collection of this run; must start with ``bench_``.
        tenant_prefix: team_id prefix of the benchmark's documents; their Neo4j nodes are
            deleted at stop. ``None`` skips the graph cleanup.
        graph_enabled: compose the Graph deployment (ingestion then MERGEs into Neo4j).
        settings: further ``GatewaySettings`` overrides (deep-merged; collection wins).
        ready_timeout_s: how long to wait for ``/readyz``.
        num_cpus: CPUs Ray may schedule (default: all).
        keep_temp: keep Ray's temp folder (logs) after a clean stop.
        ingress_replicas: Ingress replicas (default: the app's own, one), as an operator
            sets ``num_replicas`` in serve_config.yaml.
    """

    def __init__(
        self,
        *,
        port: int = 8300,
        collection: str = "bench_default",
        tenant_prefix: str | None = None,
        graph_enabled: bool = True,
        settings: dict[str, Any] | None = None,
        ready_timeout_s: float = 300.0,
        num_cpus: int | None = None,
        keep_temp: bool = False,
        ingress_replicas: int | None = None,
    ) -> None:
        if not collection.startswith(COLLECTION_PREFIX):
            raise ValueError(f"benchmark collections must start with {COLLECTION_PREFIX!r}")
        if tenant_prefix is not None and not tenant_prefix.startswith(COLLECTION_PREFIX):
            raise ValueError(f"benchmark tenants must start with {COLLECTION_PREFIX!r}")
        self._env = HarnessEnv()
        # Ray reads RAY_AUTH_MODE once, when ray is first imported: set it up before that.
        self.temp_dir: Path | None = self._env.prepare()
        from serve_app.app import AppArgs

        self.port = port
        self.collection = collection
        self.tenant_prefix = tenant_prefix
        self.graph_enabled = graph_enabled
        self.ready_timeout_s = ready_timeout_s
        self.num_cpus = num_cpus
        self.keep_temp = keep_temp
        self.ingress_replicas = ingress_replicas
        overrides = dict(settings or {})
        overrides["milvus"] = {**overrides.get("milvus", {}), "collection": collection}
        # Benchmarks measure the search itself and repeat their queries: the semantic cache
        # is off unless a benchmark configures it (bench_agent_tools measures it).
        overrides.setdefault("cache", {"enabled": False})
        self.app_args = AppArgs(settings=overrides, graph_enabled=graph_enabled)
        self.settings = self.app_args.gateway_settings()
        self.startup_s: float | None = None
        self._sigterm_saved: Any = None
        self._ray_started = False
        self._start_attempted = False
        self._failed = False

    # --- lifecycle --------------------------------------------------------------------
    def __enter__(self) -> ServeHarness:
        try:
            self.start()
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._failed = True
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def _preflight(self) -> None:
        if not port_is_free(self.port):
            raise RuntimeError(f"port {self.port} on 127.0.0.1 is in use; pass another --port")
        store = self.milvus_store()
        try:
            exists = store.conn.call("has collection", "has_collection", self.collection)
            store.close()
        except Exception as exc:
            uri = self.settings.milvus.uri
            raise RuntimeError(f"Milvus at {uri} is not reachable: {exc}") from exc
        if exists:
            # Only a crashed earlier benchmark leaves a bench_ collection behind.
            logger.warning("dropping leftover collection %s", self.collection)
            self.drop_collection()
        self.cleanup_graph()

    def start(self) -> None:
        import ray
        from ray import serve

        from serve_app.app import build_app

        started = time.perf_counter()
        self._sigterm_saved = signal.signal(signal.SIGTERM, _raise_system_exit)
        if self.temp_dir is None:  # a second start() after stop()
            self.temp_dir = self._env.prepare()
        self._start_attempted = True
        self._preflight()
        logger.info("starting local Ray (temp dir %s)", self.temp_dir)
        for attempt in (1, 2, 3):
            try:
                ray.init(
                    address="local",
                    include_dashboard=False,
                    _temp_dir=str(self.temp_dir),
                    num_cpus=self.num_cpus,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
                break
            except Exception as exc:
                # On 2 busy cores the node sometimes misses Ray's startup deadline, mostly
                # right after another cluster stopped; a retry a little later succeeds.
                if attempt == 3 or "timed out" not in str(exc).lower():
                    raise
                logger.warning("Ray node start timed out (attempt %d); retrying", attempt)
                ray.shutdown()
                time.sleep(10)
        self._ray_started = True
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        logger.info(
            "deploying app %r on %s (collection %s, graph %s)",
            APP_NAME,
            self.base_url,
            self.collection,
            "on" if self.graph_enabled else "off",
        )
        serve.run(self._build(build_app), name=APP_NAME, route_prefix="/")
        self.wait_ready()
        self.startup_s = round(time.perf_counter() - started, 1)
        logger.info("gateway ready in %.1fs", self.startup_s)

    def redeploy(self, settings: dict[str, Any]) -> None:
        """Deploy the app again on the running cluster with further ``settings`` overrides
        (deep-merged over this harness's own), e.g. to compare two configurations in one run."""
        from ray import serve

        from serve_app.app import AppArgs, build_app

        merged = deep_merge(self.app_args.settings, settings)
        self.app_args = AppArgs(settings=merged, graph_enabled=self.graph_enabled)
        self.settings = self.app_args.gateway_settings()
        logger.info("redeploying app %r with %s", APP_NAME, settings)
        serve.run(self._build(build_app), name=APP_NAME, route_prefix="/")
        self.wait_ready()

    def _build(self, build_app: Any) -> Any:
        """``build_app(self.app_args)``, with ``ingress_replicas`` when set (the Ingress's
        options are read when the app is built, as a deployment override would set them)."""
        import serve_app.app as app_module

        if self.ingress_replicas is None:
            return build_app(self.app_args)
        saved = app_module.INGRESS_OPTIONS
        app_module.INGRESS_OPTIONS = {**saved, "num_replicas": self.ingress_replicas}
        try:
            return build_app(self.app_args)
        finally:
            app_module.INGRESS_OPTIONS = saved

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        last = "no answer"
        with httpx.Client(timeout=15.0) as client:
            while time.monotonic() < deadline:
                try:
                    resp = client.get(self.url("/readyz"))
                    if resp.status_code == 200:
                        return
                    last = f"{resp.status_code} {resp.text[:300]}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(1.0)
        raise TimeoutError(f"/readyz not 200 after {self.ready_timeout_s:.0f}s; last: {last}")

    def stop(self) -> None:
        """Idempotent teardown; each step runs even if an earlier one failed."""
        if self._ray_started:
            import ray
            from ray import serve

            try:
                serve.shutdown()
            except Exception:
                logger.exception("serve.shutdown failed")
            try:
                ray.shutdown()
            except Exception:
                logger.exception("ray.shutdown failed")
            self._ray_started = False
            logger.info("Ray stopped")
        if self._start_attempted:
            self._start_attempted = False
            try:
                self.drop_collection()
            except Exception:
                logger.exception("could not drop collection %s", self.collection)
            try:
                self.cleanup_graph()
            except Exception:
                logger.exception("could not delete benchmark nodes from Neo4j")
        self._env.restore()
        if self.temp_dir is not None:
            if self._failed or self.keep_temp:
                logger.info("Ray temp dir (logs) kept at %s", self.temp_dir)
            else:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        if self._sigterm_saved is not None:
            signal.signal(signal.SIGTERM, self._sigterm_saved)
            self._sigterm_saved = None

    # --- access for the benchmarks ----------------------------------------------------
    def embedder_handle(self) -> Any:
        """The Embedder deployment's handle: calls go through ``@serve.batch`` like the
        ingress's do."""
        from ray import serve

        return serve.get_deployment_handle("Embedder", app_name=APP_NAME)

    def milvus_store(self) -> Any:
        """An in-process ``MilvusStore`` on the benchmark collection (same settings)."""
        return harness_stores.milvus_store(self.settings)

    def drop_collection(self, attempts: int = 5) -> None:
        """Drop the benchmark collection (``bench.harness_stores.drop_collection``: retried)."""
        harness_stores.drop_collection(self.milvus_store, self.collection, attempts)

    def cleanup_graph(self) -> int:
        """Delete every Neo4j node whose team_id starts with the benchmark tenant prefix."""
        if self.tenant_prefix is None or not self.graph_enabled:
            return 0
        return harness_stores.delete_tenant_nodes(self.settings.neo4j, self.tenant_prefix)
