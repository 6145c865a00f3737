"""A two-node Ray cluster on this machine, the gateway deployed on it with ``serve deploy``,
and the worker node stopped and started again under traffic.

    python scripts/two_node.py [--outage-s 45] [--out bench/results]

What it does, each step printed and recorded in ``bench/results/two_node-<UTC>.json``:

1. ``ray start --head`` (3 logical CPUs, resource ``rag_head``, the dashboard for
   ``serve deploy``) and ``ray start --address`` for a worker (3 CPUs, ``rag_worker``), each in
   its own process group, so one can be stopped without the other (``ray stop`` would stop
   both). ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1``: Ray refuses a second node otherwise.
2. ``serve_config.yaml`` rendered for two nodes (Ingress, Embedder and Retriever with 2
   replicas and ``max_replicas_per_node: 1``, so one of each lands on each node; the proxy on
   the head only, port 8400; collection ``twonode``), deployed with the ``serve deploy`` CLI.
3. Searches and ingestions from two client threads all along; the replicas' nodes listed.
4. The worker node stopped (SIGTERM to its ``ray start --block``): what the clients saw, how
   long until every request succeeded again, where the replicas went.
5. The worker started again: how long until replicas run on both nodes again.
6. ``serve deploy`` twice more under the same traffic (other Embedder batch settings, one
   Retriever instead of two, then back).
7. A reindex job through ``POST /admin/reindex`` under the same traffic, its embedding actors
   placed on the worker (``reindex.actor_resources: {rag_worker: 1}``): the nodes its actors
   ran on, and that it succeeded with every chunk.
8. Chunks: every document whose ingestion answered 200 is in Milvus exactly once
   (``count`` per team equals the chunks the answers reported).

Needs the services (``python scripts/services.py up``) and nothing else on ports 6390, 8275
and 8400. Everything it starts is stopped at the end; the collection is dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
GCS_PORT, DASHBOARD_PORT, HTTP_PORT = 6390, 8275, 8400
COLLECTION = "twonode"
BASE = f"http://127.0.0.1:{HTTP_PORT}"
SCALED = ("Ingress", "Embedder", "Retriever")


def log(message: str) -> None:
    print(f"[two-node {time.strftime('%H:%M:%S')}] {message}", flush=True)


def render_config(path: Path) -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["proxy_location"] = "HeadOnly"  # one proxy port on this one host
    config["http_options"]["port"] = HTTP_PORT
    app = config["applications"][0]
    app["args"]["settings"]["milvus"]["collection"] = COLLECTION
    # A reindex job's embedding actors ask for the worker's resource, so they run there.
    app["args"]["settings"].setdefault("reindex", {})["actor_resources"] = {"rag_worker": 1}
    for dep in app["deployments"]:
        if dep["name"] in SCALED:
            dep.pop("autoscaling_config", None)
            dep["num_replicas"] = 2
            dep["max_replicas_per_node"] = 1
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config


class Node:
    """One ``ray start --block`` in its own process group."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path) -> None:
        self.name, self.args, self.env = name, args, env
        self.logfile = logdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.logfile.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "ray"), "start", *self.args, "--block", "--disable-usage-stats"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


class Traffic:
    """Searches and ingestions in two threads; every answer recorded with its time."""

    def __init__(self, team: str) -> None:
        self.team = team
        self.events: list[tuple[float, str, int, float]] = []  # (t, kind, status, seconds)
        self.ingested: dict[str, int] = {}  # doc_id -> chunks, from 200 answers
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._loop, args=(kind,), daemon=True)
            for kind in ("search", "ingest")
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _loop(self, kind: str) -> None:
        n = 0
        with httpx.Client(base_url=BASE, timeout=130) as client:
            while not self.stop.is_set():
                n += 1
                started = time.monotonic()
                status, chunks, doc_id = 0, 0, f"d{n:05d}"
                try:
                    if kind == "search":
                        r = client.post(
                            "/rag/search_docs",
                            # A different query each time: no answer from the cache.
                            json={"team_id": self.team, "query": f"battery report {n} peak"},
                        )
                    else:
                        text = (
                            f"Report {n}: the cooperative's battery storage covered the evening "
                            f"peak of district {n % 17}; the inverter log shows {n * 3} cycles."
                        )
                        doc = {"team_id": self.team, "doc_id": doc_id, "text": text}
                        r = client.post("/ingest/documents", json={"documents": [doc]})
                        if r.status_code == 200 and r.json()["indexed"] == 1:
                            chunks = r.json()["documents"][0]["chunks"]
                    status = r.status_code
                except httpx.HTTPError:
                    status = -1
                took = time.monotonic() - started
                with self._lock:
                    self.events.append((time.time(), kind, status, took))
                    if chunks:
                        self.ingested[doc_id] = chunks
                if status != 200:
                    time.sleep(0.2)
                elif kind == "ingest":
                    time.sleep(0.5)

    def window(self, since: float, until: float) -> dict[str, Any]:
        with self._lock:
            rows = [e for e in self.events if since <= e[0] < until]
        out: dict[str, Any] = {}
        for kind in ("search", "ingest"):
            mine = [e for e in rows if e[1] == kind]
            statuses: dict[str, int] = {}
            for e in mine:
                statuses[str(e[2])] = statuses.get(str(e[2]), 0) + 1
            out[kind] = {
                "requests": len(mine),
                "statuses": statuses,
                "worst_s": round(max((e[3] for e in mine), default=0.0), 2),
            }
        return out

    def last_failure(self) -> float | None:
        with self._lock:
            bad = [e[0] for e in self.events if e[2] != 200]
        return max(bad) if bad else None


def placement() -> dict[str, list[str]]:
    """Deployment name -> node ids of its running replicas."""
    from ray.util.state import list_actors

    out: dict[str, list[str]] = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], limit=1000):
        name = actor.class_name or ""
        if not name.startswith("ServeReplica:"):
            continue
        deployment = name.split(":")[-1]
        out.setdefault(deployment, []).append(actor.node_id[:8])
    return out


def serve_deploy(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``serve deploy <config>`` through the head's dashboard, as an operator runs it."""
    return subprocess.run(
        [
            str(VENV_BIN / "serve"),
            "deploy",
            str(config),
            "-a",
            f"http://127.0.0.1:{DASHBOARD_PORT}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def wait_ready(timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if httpx.get(BASE + "/readyz", timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"gateway not ready after {timeout:.0f} s")


def reindex_on_worker(worker_node: str, timeout: float = 420) -> dict[str, Any]:
    """Seed a team, reindex it through the admin API, and record where the Ray Data
    actors that embedded it ran (the node ids of every ``ReindexWorker`` actor seen)."""
    from ray.util.state import list_actors

    team = f"dao_twonode_reidx_{uuid.uuid4().hex[:6]}"
    docs = [
        {
            "team_id": team,
            "doc_id": f"psalm{i}",
            "title": f"Note {i}",
            "text": f"Note {i} on the greenhouse pumps and their night schedule. "
            + " ".join(f"detail{i}_{j}" for j in range(120)),
        }
        for i in range(40)
    ]
    r = httpx.post(BASE + "/ingest/documents", json={"documents": docs}, timeout=300)
    r.raise_for_status()
    started = time.monotonic()
    r = httpx.post(BASE + "/admin/reindex", json={"team_id": team}, timeout=60)
    if r.status_code != 202:
        return {"submitted": r.status_code, "body": r.text[:500]}
    job_id = r.json()["job_id"]
    nodes: set[str] = set()
    job: dict[str, Any] = {}
    while time.monotonic() - started < timeout:
        for actor in list_actors(filters=[("state", "=", "ALIVE")], limit=1000):
            if "ReindexWorker" in (actor.class_name or ""):
                nodes.add(actor.node_id[:8])
        job = httpx.get(f"{BASE}/admin/reindex/{job_id}", timeout=30).json()
        if job.get("status") not in ("queued", "running", "switching"):
            break
        time.sleep(1)
    return {
        "job_id": job_id,
        "status": job.get("status"),
        "took_s": round(time.monotonic() - started, 1),
        "expected_chunks": job.get("expected_chunks"),
        "rows_in_target": job.get("rows_in_target"),
        "actor_nodes": sorted(nodes),
        "worker_node": worker_node,
        "actors_on_worker_only": bool(nodes) and nodes == {worker_node},
    }


def both_nodes(place: dict[str, list[str]], nodes: int = 2) -> bool:
    return all(len(set(place.get(d, []))) == nodes for d in SCALED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage-s", type=float, default=45.0, help="worker down this long")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rag-two-node-"))
    token = tmp / "ray_token"
    token.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
    }
    os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "3"]
    head = Node(
        "head",
        [
            "--head",
            "--port",
            str(GCS_PORT),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(DASHBOARD_PORT),
            "--resources",
            '{"rag_head": 1}',
            "--temp-dir",
            str(tmp / "ray"),
            *common,
        ],
        env,
        tmp,
    )
    worker = Node(
        "worker",
        ["--address", f"127.0.0.1:{GCS_PORT}", "--resources", '{"rag_worker": 1}', *common],
        env,
        tmp,
    )
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(),
        "outage_s": args.outage_s,
        "config": "serve_config.yaml with Ingress/Embedder/Retriever x2, max_replicas_per_node 1",
    }
    team = f"dao_twonode_{uuid.uuid4().hex[:6]}"
    traffic = Traffic(team)
    try:
        log("starting the head node")
        head.start()
        time.sleep(8)
        log("starting the worker node")
        worker.start()
        time.sleep(8)
        import ray

        ray.init(address=f"127.0.0.1:{GCS_PORT}", logging_level="ERROR")
        nodes = [n for n in ray.nodes() if n["Alive"]]
        result["nodes"] = [{"id": n["NodeID"][:8], "resources": n["Resources"]} for n in nodes]
        log(f"{len(nodes)} nodes alive")
        config = tmp / "serve_two_node.yaml"
        render_config(config)
        log("serve deploy (the CLI, through the head's dashboard)")
        deployed = serve_deploy(config, env)
        result["serve_deploy"] = {"rc": deployed.returncode, "output": deployed.stdout[-500:]}
        if deployed.returncode != 0:
            raise SystemExit(f"serve deploy failed: {deployed.stderr[-2000:]}")
        result["ready_after_s"] = round(wait_ready(300), 1)
        deadline = time.monotonic() + 180
        while not both_nodes(placement()) and time.monotonic() < deadline:
            time.sleep(2)
        result["placement_before"] = placement()
        log(f"replicas by node: {result['placement_before']}")
        traffic.start()
        time.sleep(20)
        t0 = time.time()
        log(f"stopping the worker node for {args.outage_s:.0f} s")
        worker.stop()
        time.sleep(args.outage_s)
        t1 = time.time()
        result["during_outage"] = traffic.window(t0, t1)
        last_bad = traffic.last_failure()
        result["all_ok_again_after_s"] = (
            round(last_bad - t0, 1) if last_bad is not None and last_bad >= t0 else 0.0
        )
        result["placement_during"] = placement()
        log(f"during the outage: {result['during_outage']}; replicas {result['placement_during']}")
        log("starting the worker node again")
        worker.start()
        deadline = time.monotonic() + 240
        back = None
        while time.monotonic() < deadline:
            if both_nodes(placement()):
                back = time.time() - t1
                break
            time.sleep(2)
        result["replicas_on_both_nodes_again_after_s"] = round(back, 1) if back else None
        result["placement_after"] = placement()
        time.sleep(15)
        t2 = time.time()
        result["after_recovery"] = traffic.window(t1 + (back or 0), t2)
        # serve deploy again under the same traffic: other batch settings for the Embedder
        # (user_config, in place) and one Retriever replica instead of two; then back.
        for step, (batch, retrievers) in enumerate(((16, 1), (32, 2))):
            changed = render_config(config)
            for dep in changed["applications"][0]["deployments"]:
                if dep["name"] == "Embedder":
                    dep["user_config"]["max_batch_size"] = batch
                if dep["name"] == "Retriever":
                    dep["num_replicas"] = retrievers
            config.write_text(yaml.safe_dump(changed, sort_keys=False))
            log(f"serve deploy again: Embedder max_batch_size {batch}, {retrievers} Retriever(s)")
            t3 = time.time()
            again = serve_deploy(config, env)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if len(placement().get("Retriever", [])) == retrievers:
                    break
                time.sleep(2)
            time.sleep(10)
            result[f"redeploy_{step + 1}"] = {
                "rc": again.returncode,
                "embedder_max_batch_size": batch,
                "retrievers": len(placement().get("Retriever", [])),
                **traffic.window(t3, time.time()),
            }
            log(f"redeploy {step + 1}: {result[f'redeploy_{step + 1}']}")
        # The worker came back as a new node (a new id): look it up again.
        worker_ids = [
            n["NodeID"][:8] for n in ray.nodes() if n["Alive"] and "rag_worker" in n["Resources"]
        ]
        log("reindex through /admin/reindex, its actors asking for the worker's resource")
        t4 = time.time()
        result["reindex"] = reindex_on_worker(worker_ids[0] if worker_ids else "")
        result["reindex"]["traffic"] = traffic.window(t4, time.time())
        log(f"reindex: {result['reindex']}")
        traffic.join()
        result["total"] = traffic.window(0, time.time() + 1)
        from deployments.config import MilvusSettings
        from deployments.vector_store.store import MilvusStore

        store = MilvusStore(MilvusSettings(collection=COLLECTION), dim=384)
        store.start()
        store.flush(team)
        expected = sum(traffic.ingested.values())
        result["chunks"] = {"expected": expected, "in_milvus": store.count(team)}
        store.drop()
        store.close()
        log(f"chunks: {result['chunks']}")
    finally:
        traffic.stop.set()
        try:
            subprocess.run(
                [
                    str(VENV_BIN / "serve"),
                    "shutdown",
                    "-y",
                    "-a",
                    f"http://127.0.0.1:{DASHBOARD_PORT}",
                ],
                env=env,
                capture_output=True,
                timeout=120,
            )
        except Exception as exc:  # the cluster is stopped next anyway
            log(f"serve shutdown: {exc}")
        worker.stop()
        head.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"two_node-{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    log(f"wrote {path}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
