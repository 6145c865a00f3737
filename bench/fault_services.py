"""The services a fault stops and starts again (``Services``): ``scripts/services.py
down|up --only <name>`` for the machine's shared Milvus, Neo4j, NATS and Redis, or for
private ones in a temporary ``RAG_VAR_DIR`` on their own ports (``--private-services``),
without blocking the load's event loop, bounded, and restored whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT

logger = logging.getLogger("bench.faults")

SERVICES = REPO_ROOT / "scripts" / "services.py"
PRIVATE_PORTS = {"milvus": 19631, "neo4j": 7788, "nats": 4323, "redis": 6481}
PORT_ENV = {
    "milvus": "RAG_MILVUS_PORT",
    "neo4j": "RAG_NEO4J_PORT",
    "nats": "RAG_NATS_PORT",
    "redis": "RAG_REDIS_PORT",
}


class Services:
    """``scripts/services.py`` for the machine's services, or for private ones in their own
    ``RAG_VAR_DIR`` and ports (``private``)."""

    def __init__(self, private: bool) -> None:
        self.private = private
        self.env = dict(os.environ)
        self.var: Path | None = None
        self.ports = {
            "milvus": int(os.environ.get("RAG_MILVUS_PORT", "19530")),
            "neo4j": int(os.environ.get("RAG_NEO4J_PORT", "7687")),
            "nats": int(os.environ.get("RAG_NATS_PORT", "4222")),
            "redis": int(os.environ.get("RAG_REDIS_PORT", "6380")),
        }
        if private:
            self.var = Path(tempfile.mkdtemp(prefix="bench_faults_var_", dir="/tmp"))
            self.env["RAG_VAR_DIR"] = str(self.var)
            self.env.setdefault("RAG_NEO4J_HEAP", "512m")
            self.env.setdefault("RAG_NEO4J_PAGECACHE", "64m")
            for name, port in PRIVATE_PORTS.items():
                self.ports[name] = port
                self.env[PORT_ENV[name]] = str(port)
        self.started: list[str] = []  # private services started by this run
        self.down_now: set[str] = set()  # stopped by a fault and not started again yet

    def url(self, name: str) -> str:
        port = self.ports[name]
        return {
            "milvus": f"http://127.0.0.1:{port}",
            "neo4j": f"bolt://127.0.0.1:{port}",
            "nats": f"nats://127.0.0.1:{port}",
            "redis": f"redis://127.0.0.1:{port}/0",
        }[name]

    def _argv(self, command: str, name: str) -> list[str]:
        return [sys.executable, str(SERVICES), command, "--only", name]

    def run_sync(self, command: str, name: str, timeout_s: float) -> dict[str, Any]:
        t0 = time.monotonic()
        proc = subprocess.run(
            self._argv(command, name),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        out = (proc.stdout + proc.stderr).strip().splitlines()
        return {"rc": proc.returncode, "s": round(time.monotonic() - t0, 2), "log": out[-4:]}

    async def run(self, command: str, name: str, timeout_s: float) -> dict[str, Any]:
        """``services.py <command> --only <name>`` without blocking the event loop (the load
        goes on); bounded by ``timeout_s``."""
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self._argv(command, name),
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        rc: int | str | None
        try:
            raw, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
            rc = proc.returncode
        except TimeoutError:
            proc.kill()
            raw, rc = b"", "timeout"
        if command == "down":
            self.down_now.add(name)
        elif command == "up" and rc == 0:
            self.down_now.discard(name)
        lines = raw.decode(errors="replace").strip().splitlines()
        return {"rc": rc, "s": round(time.monotonic() - t0, 2), "log": lines[-4:]}

    def start_private(self, names: list[str]) -> None:
        for name in names:
            logger.info("starting a private %s on port %d", name, self.ports[name])
            res = self.run_sync("up", name, 300)
            if res["rc"] != 0:
                raise RuntimeError(f"private {name} did not start: {res}")
            self.started.append(name)
            if name == "neo4j":
                self.create_graph_schema()

    def create_graph_schema(self) -> None:
        """The graph schema on a fresh private Neo4j, before the gateway starts: created by
        the Graph replica's first connection instead, on 2 busy cores, a bootstrap cut off by
        a caller's deadline can leave an orphan index behind (the report's finding)."""
        from neo4j import GraphDatabase

        from deployments.graph_store.cypher import schema_statements

        password = self.env.get("NEO4J__PASSWORD", "rag-gateway-dev")
        with GraphDatabase.driver(self.url("neo4j"), auth=("neo4j", password)) as driver:
            for statement in schema_statements():
                driver.execute_query(statement)
        logger.info("created the graph schema on the private Neo4j")

    def restore_all(self) -> None:
        """Start again every service a fault stopped (the ``finally`` of the run)."""
        for name in sorted(self.down_now):
            logger.warning("restoring %s", name)
            try:
                res = self.run_sync("up", name, 300)
                logger.info("restored %s: %s", name, res)
                if res["rc"] == 0:
                    self.down_now.discard(name)
            except Exception:
                logger.exception("could not restore %s: start it with scripts/services.py", name)

    def stop_private(self) -> None:
        for name in reversed(self.started):
            with contextlib.suppress(Exception):
                self.run_sync("down", name, 120)
        self.started.clear()
        if self.var is not None:
            shutil.rmtree(self.var, ignore_errors=True)
