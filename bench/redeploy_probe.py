"""What a ``serve deploy`` that changes one deployment restarts, how long it takes to settle and
how long a request waits meanwhile, on the shipped setup; and whether every replica writes its
access lines to its JSON log.

    flock /tmp/rag-ray.lock .venv/bin/python bench/redeploy_probe.py \
        [--deployment Retriever] [--how num_replicas|min_replicas]

Run it under that lock, with no other Ray cluster on the machine: it starts Ray the way
``scripts/start.sh`` does (``scripts/ray_local.sh up``: one node, 2 CPUs, the dashboard on
127.0.0.1:8265, token auth), with ``PYTHONPATH`` at this checkout so the replicas import this
checkout's code whatever is pip-installed, and stops it with ``ray_local.sh down`` (``ray stop
--force``; ``--keep`` leaves it running). It deploys ``serve_config.yaml`` with the ``serve
deploy`` CLI (rendered with HTTP port 8300 and the Milvus collection ``bench_redeploy``,
nothing else changed), ingests a few documents into the team ``bench_redeploy_t01``, then,
while a client sends a search every 0.2 s (a new query each time; the semantic cache may
still answer a similar one), runs ``serve deploy`` with ``--deployment`` at 2 replicas, waits
until it settles, and ``serve deploy`` of the shipped config again.

``--how`` says how the config asks for 2 replicas: ``num_replicas`` (the deployment's
autoscaling block replaced by ``num_replicas: 2``, which reproduces issue 32's full restart)
or ``min_replicas`` (``autoscaling_config.min_replicas: 2``, as serve_config.yaml says to).

Per deploy it records the replicas (replica id, pid) of every deployment before and after,
which were stopped and which started, the settle time (from the ``serve deploy`` call until
the application took the config and is RUNNING, every deployment HEALTHY with only RUNNING
replicas and the changed one at its count: 2 up; back down, anything inside the shipped
autoscaling bounds, as Serve removes a replica only after the block's downscale delay), and
the searches sent from the call until 2 s after it settled: count, statuses, p50, the longest,
and how many took over 1 s. At the end it counts the access lines (``CALL candidates_packed
OK 3.1ms``, ``POST /rag/search_docs 200 41.0ms``) of every replica the run saw, in its JSON
log file (``logs/serve/replica_*.log``) and in its worker's stderr (``logs/worker-<worker
id>-*.err``, Serve's text lines), which must agree: export ``RAY_SERVE_LOG_TO_STDERR=1``
before ``scripts/ray_local.sh up``, since the shipped environment writes no stderr copy
(deployments/serve_env.py).

At the end it drops the collection and deletes the team's Neo4j nodes; the other services
are left alone. The result goes to ``bench/results/redeploy_probe-<time>.json`` (``--out``)
and a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import markdown_table, setup_logging, write_result  # noqa: E402

logger = logging.getLogger("bench.redeploy")

APP = "rag_gateway"
PORT = 8300
DASHBOARD = "http://127.0.0.1:8265"
COLLECTION = "bench_redeploy"
TEAM = "bench_redeploy_t01"
VENV_BIN = Path(sys.executable).parent
# Serve's access line: "<METHOD or CALL> <route or method> <status> <ms>ms".
ACCESS = re.compile(r"(?:CALL|GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) \S+ \S+ [\d.]+ms$")
DOCS = [
    "The cooperative's battery storage covered the evening peak of district {n}.",
    "Inverter logs of site {n} show charge cycles, faults and the technician's notes.",
    "Milvus keeps the vectors; the gateway searches them with BM25 beside the dense index.",
]


def environment(var: Path) -> dict[str, str]:
    """The variables ``scripts/start.sh`` exports, plus this checkout first on the path."""
    env = dict(os.environ)
    env.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(var / "ray_auth_token"),
        RAG_VAR_DIR=str(var),
        RAG_VENV=str(VENV_BIN.parent),
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
    )
    return env


def render(replicas: int | None, how: str, deployment: str = "Retriever") -> dict[str, Any]:
    """serve_config.yaml, with the bench port and collection, and ``replicas`` replicas of
    ``deployment`` when given."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = PORT
    app = config["applications"][0]
    app["args"]["settings"]["milvus"]["collection"] = COLLECTION
    if replicas is not None:
        (dep,) = [d for d in app["deployments"] if d["name"] == deployment]
        if how == "num_replicas":
            dep.pop("autoscaling_config", None)
            dep["num_replicas"] = replicas
        else:
            auto = dep["autoscaling_config"]
            auto["min_replicas"] = replicas
            auto["max_replicas"] = max(auto["max_replicas"], replicas)
    return config


def serve_deploy(config: dict[str, Any], path: Path, env: dict[str, str]) -> int:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    done = subprocess.run(
        [str(VENV_BIN / "serve"), "deploy", str(path), "-a", DASHBOARD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        logger.error("serve deploy failed: %s", done.stderr[-2000:])
    return done.returncode


class Serve:
    """The dashboard's Serve API: application status and every replica."""

    def __init__(self) -> None:
        from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

        self.client = ServeSubmissionClient(DASHBOARD)

    def app(self) -> dict[str, Any]:
        return self.client.get_serve_details().get("applications", {}).get(APP, {})

    def replicas(self, app: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """replica id -> deployment, state, actor id, pid, worker id, log file."""
        app = self.app() if app is None else app
        out = {}
        for name, dep in app.get("deployments", {}).items():
            for rep in dep.get("replicas", []):
                out[rep["replica_id"]] = {
                    "deployment": name,
                    "state": rep["state"],
                    "actor_id": rep.get("actor_id"),
                    "pid": rep.get("pid"),
                    "worker_id": rep.get("worker_id"),
                    "log_file_path": rep.get("log_file_path"),
                }
        return out

    def settled(self, app: dict[str, Any], target: tuple[str, int, int], since: float) -> bool:
        # The controller stamps the application when it takes a config: until then the
        # status is the previous deploy's.
        if app.get("status") != "RUNNING" or app.get("last_deployed_time_s", 0) < since:
            return False
        for name, dep in app.get("deployments", {}).items():
            if dep.get("status") != "HEALTHY":
                return False
            states = [r["state"] for r in dep.get("replicas", [])]
            if any(s != "RUNNING" for s in states):
                return False
            if name == target[0] and not target[1] <= len(states) <= target[2]:
                return False
        return True

    def wait(
        self,
        target: tuple[str, int, int],
        timeout: float,
        seen: dict[str, dict[str, Any]],
        since: float,
    ) -> float:
        """Seconds until settled (the config sent at ``since``, a wall time, applied); every
        replica seen meanwhile is added to ``seen``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                app = self.app()
            except Exception as exc:  # the dashboard busy on 2 cores: ask again
                logger.warning("serve details: %s", exc)
                time.sleep(1)
                continue
            for rid, rep in self.replicas(app).items():
                seen.setdefault(rid, {}).update({k: v for k, v in rep.items() if v})
            if self.settled(app, target, since):
                return time.monotonic() - started
            time.sleep(0.25)
        raise SystemExit(f"not settled after {timeout:.0f} s: {self.app().get('status')}")


class Searches:
    """A search every ``every_s`` (the next one right after a late one), each recorded."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.rows: list[tuple[float, float, int]] = []  # (start, seconds, status)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        n = 0
        next_at = time.monotonic()
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=120) as client:
            while not self.stop.is_set():
                n += 1
                start_wall, start = time.time(), time.monotonic()
                body = {"team_id": TEAM, "query": f"battery peak {n} inverter"}
                try:
                    status = client.post("/rag/search_docs", json=body).status_code
                except httpx.HTTPError:
                    status = -1
                self.rows.append((start_wall, time.monotonic() - start, status))
                next_at = max(next_at + self.every_s, time.monotonic())
                self.stop.wait(max(0.0, next_at - time.monotonic()))

    def window(self, since: float, until: float) -> dict[str, Any]:
        rows = [r for r in self.rows if since <= r[0] <= until]
        took = [r[1] for r in rows]
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[str(r[2])] = statuses.get(str(r[2]), 0) + 1
        return {
            "requests": len(rows),
            "statuses": statuses,
            "p50_ms": round(statistics.median(took) * 1000, 1) if took else None,
            "max_s": round(max(took), 2) if took else None,
            "over_1s": sum(t > 1.0 for t in took),
        }


def step(
    name: str,
    config: dict[str, Any],
    target: tuple[str, int, int],
    serve: Serve,
    searches: Searches,
    seen: dict[str, dict[str, Any]],
    env: dict[str, str],
    var: Path,
) -> dict[str, Any]:
    before = {rid: r for rid, r in serve.replicas().items() if r["state"] == "RUNNING"}
    t0 = time.time()
    rc = serve_deploy(config, var / f"redeploy_{name}.yaml", env)
    serve.wait(target, 300, seen, t0 - 1)
    settle_s = time.time() - t0  # from the `serve deploy` call
    time.sleep(2)
    after = serve.replicas()
    window = searches.window(t0, time.time())

    def by_deployment(ids: set[str], where: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for rid in sorted(ids):
            rep = where[rid]
            out.setdefault(rep["deployment"], []).append(f"{rid} pid {rep['pid']}")
        return out

    result = {
        "step": name,
        "rc": rc,
        "settle_s": round(settle_s, 1),
        "replicas_before": by_deployment(set(before), before),
        "stopped": by_deployment(set(before) - set(after), before),
        "started": by_deployment(set(after) - set(before), after),
        "searches": window,
    }
    logger.info("%s: %s", name, json.dumps(result))
    return result


def count_access_lines(seen: dict[str, dict[str, Any]], logs_dir: Path) -> list[dict[str, Any]]:
    """Access lines of every replica seen: in its JSON log file and in its worker's stderr."""
    rows = []
    for rid, rep in sorted(seen.items(), key=lambda kv: (kv[1]["deployment"], kv[0])):
        json_lines = file_access = 0
        path = logs_dir / str(rep.get("log_file_path", "")).lstrip("/")
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    json_lines += 1
                    if ACCESS.search(json.loads(line).get("message", "")):
                        file_access += 1
        stderr_access = 0
        for err in logs_dir.glob(f"worker-{rep.get('worker_id')}-*.err"):
            for line in err.read_text(errors="replace").splitlines():
                if rid in line and ACCESS.search(line):
                    stderr_access += 1
        rows.append(
            {
                "deployment": rep["deployment"],
                "replica": rid,
                "pid": rep.get("pid"),
                "json_lines": json_lines,
                "access_lines_in_json_log": file_access,
                "access_lines_on_stderr": stderr_access,
            }
        )
    return rows


def cleanup() -> None:
    from deployments.vector_store.store import MilvusStore
    from serve_app.app import AppArgs

    settings = AppArgs(**render(None, "")["applications"][0]["args"]).gateway_settings()
    store = MilvusStore(settings.milvus, dim=384)
    try:
        store.drop()
    finally:
        store.close()
    from neo4j import GraphDatabase

    cfg = settings.neo4j
    with GraphDatabase.driver(cfg.uri, auth=(cfg.user, cfg.password)) as driver:
        driver.execute_query(
            "MATCH (n) WHERE n.team_id = $team DETACH DELETE n",
            {"team": TEAM},
            database_=cfg.database,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--how", choices=("num_replicas", "min_replicas"), default="num_replicas")
    parser.add_argument(
        "--deployment", choices=("Retriever", "Ingress", "Embedder", "Graph"), default="Retriever"
    )
    parser.add_argument("--keep", action="store_true", help="leave Ray running at the end")
    parser.add_argument("--label", default="", help="a note stored with the result")
    parser.add_argument("--out", default=None)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    var = ROOT / "var" / "redeploy_probe"
    var.mkdir(parents=True, exist_ok=True)
    env = environment(var)
    os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
    dep = args.deployment
    result: dict[str, Any] = {
        "deployment": dep,
        "how": args.how,
        "label": args.label,
        "commit": git_head(),
    }
    subprocess.run(["bash", str(ROOT / "scripts/ray_local.sh"), "up"], env=env, check=True)
    try:
        logs_dir = Path("/tmp/ray/session_latest").resolve() / "logs"
        result["logs_dir"] = str(logs_dir)
        serve = Serve()
        seen: dict[str, dict[str, Any]] = {}
        t0, sent = time.monotonic(), time.time()
        if serve_deploy(render(None, args.how), var / "redeploy_base.yaml", env) != 0:
            return 1
        serve.wait((dep, 1, 1), 600, seen, sent - 1)
        result["first_deploy_s"] = round(time.monotonic() - t0, 1)
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=120) as client:
            docs = [
                {"team_id": TEAM, "doc_id": f"d{i}", "text": text.format(n=i)}
                for i, text in enumerate(DOCS * 4)
            ]
            r = client.post("/ingest/documents", json={"documents": docs})
            r.raise_for_status()
        searches = Searches()
        searches.thread.start()
        time.sleep(5)
        result["steady"] = searches.window(time.time() - 5, time.time())
        up = render(2, args.how, dep)
        result["up"] = step("up", up, (dep, 2, 2), serve, searches, seen, env, var)
        time.sleep(5)
        # Back to the shipped config: with an autoscaling block of 1 to 2 replicas, 2 kept is
        # settled too (Serve scales down after the block's downscale delay).
        back = render(None, args.how)
        (shipped,) = [d for d in back["applications"][0]["deployments"] if d["name"] == dep]
        most = shipped.get("autoscaling_config", {}).get("max_replicas", 1)
        result["down"] = step("down", back, (dep, 1, max(1, most)), serve, searches, seen, env, var)
        time.sleep(3)
        searches.stop.set()
        searches.thread.join(timeout=130)
        time.sleep(2)  # the last access lines reach the files
        result["access_lines"] = count_access_lines(seen, logs_dir)
    finally:
        if not args.keep:
            subprocess.run(["bash", str(ROOT / "scripts/ray_local.sh"), "down"], env=env)
        try:
            cleanup()
        except Exception:
            logger.exception("cleanup failed")
    table = render_table(result)
    result["table_markdown"] = table
    path = write_result("redeploy_probe", result, args.out)
    print(table)
    logger.info("result: %s", path)
    return 0


def render_table(result: dict[str, Any]) -> str:
    rows = []
    for name in ("up", "down"):
        s = result.get(name)
        if not s:
            continue
        rows.append(
            [
                f"{result['deployment']} {name} ({result['how']})",
                s["settle_s"],
                ", ".join(f"{d} {len(v)}" for d, v in s["stopped"].items()) or "none",
                ", ".join(f"{d} {len(v)}" for d, v in s["started"].items()) or "none",
                s["searches"]["requests"],
                s["searches"]["max_s"],
                s["searches"]["over_1s"],
                s["searches"]["statuses"],
            ]
        )
    out = markdown_table(
        [
            "deploy",
            "settle s",
            "replicas stopped",
            "replicas started",
            "searches",
            "longest s",
            "over 1 s",
            "statuses",
        ],
        rows,
    )
    lines = [
        [
            r["deployment"],
            r["replica"],
            r["access_lines_in_json_log"],
            r["access_lines_on_stderr"],
        ]
        for r in result.get("access_lines", [])
    ]
    return (
        out
        + "\n\n"
        + markdown_table(["deployment", "replica", "access lines, JSON log", "on stderr"], lines)
    )


def git_head() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
