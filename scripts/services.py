#!/usr/bin/env python3
"""Start, stop and check the embedded backing services on 127.0.0.1.

    python scripts/services.py up       # Milvus Lite server + Neo4j 5.26, waits until ready
    python scripts/services.py status
    python scripts/services.py down

Milvus Lite runs as its own server process so that every Serve replica and batch job shares
one store. Neo4j is the real 5.26 Community server, resolved from Maven Central by
scripts/neo4j/pom.xml and started by scripts/neo4j/Launcher.java, with a capped heap and page
cache. State, logs and pid files live in $RAG_VAR_DIR (default ./var).

Environment: RAG_VAR_DIR, RAG_MILVUS_PORT (19530), RAG_NEO4J_PORT (7687),
NEO4J__PASSWORD (rag-gateway-dev), RAG_NEO4J_HEAP (768m), RAG_NEO4J_PAGECACHE (128m).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEO4J_SRC = ROOT / "scripts" / "neo4j"
VAR = Path(os.environ.get("RAG_VAR_DIR", ROOT / "var")).resolve()
MILVUS_PORT = int(os.environ.get("RAG_MILVUS_PORT", "19530"))
NEO4J_PORT = int(os.environ.get("RAG_NEO4J_PORT", "7687"))
NEO4J_PASSWORD = os.environ.get("NEO4J__PASSWORD", "rag-gateway-dev")
NEO4J_HEAP = os.environ.get("RAG_NEO4J_HEAP", "768m")
NEO4J_PAGECACHE = os.environ.get("RAG_NEO4J_PAGECACHE", "128m")


def log(msg: str) -> None:
    print(f"[services] {msg}", flush=True)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None


def spawn(name: str, argv: list[str], cwd: Path | None = None) -> None:
    logs = VAR / "log"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (VAR / f"{name}.pid").write_text(str(proc.pid))
    log(f"{name} started (pid {proc.pid}, log {logs / (name + '.log')})")


def wait_until(name: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                log(f"{name} ready")
                return
        except Exception as exc:  # still starting
            last = exc
        if pid_alive(VAR / f"{name}.pid") is None:
            tail = (VAR / "log" / f"{name}.log").read_text(errors="replace")[-2000:]
            sys.exit(f"[services] {name} exited during start-up; log tail:\n{tail}")
        time.sleep(1)
    sys.exit(f"[services] {name} not ready after {timeout:.0f}s (last error: {last})")


# --- Milvus Lite --------------------------------------------------------------------
def milvus_up() -> None:
    if pid_alive(VAR / "milvus.pid") and port_open(MILVUS_PORT):
        log(f"milvus already running on 127.0.0.1:{MILVUS_PORT}")
        return
    if port_open(MILVUS_PORT):
        sys.exit(f"[services] port {MILVUS_PORT} is taken by another process; set RAG_MILVUS_PORT")
    exe = Path(sys.executable).with_name("milvus-lite")
    # Always pass --host: the default binds every interface.
    spawn(
        "milvus",
        [
            str(exe),
            "server",
            "--data-dir",
            str(VAR / "milvus"),
            "--host",
            "127.0.0.1",
            "--port",
            str(MILVUS_PORT),
        ],
    )

    def ready() -> bool:
        from pymilvus import MilvusClient

        client = MilvusClient(uri=f"http://127.0.0.1:{MILVUS_PORT}", timeout=5)
        client.list_collections()
        client.close()
        return True

    wait_until("milvus", ready, 120)


# --- Neo4j ----------------------------------------------------------------------------
NEO4J_CONF = """\
# Written by scripts/services.py; edit the script, not this file.
server.bolt.enabled=true
server.bolt.listen_address=127.0.0.1:{port}
server.bolt.advertised_address=127.0.0.1:{port}
server.http.enabled=false
server.https.enabled=false
dbms.security.auth_enabled=true
server.memory.pagecache.size={pagecache}
dbms.memory.transaction.total.max=256m
db.transaction.timeout=60s
server.directories.logs={home}/logs
"""


def neo4j_jars() -> Path:
    lib = NEO4J_SRC / "lib"
    if not any(lib.glob("neo4j-kernel-*.jar")):
        log("resolving Neo4j 5.26 jars from Maven Central (first run only)...")
        subprocess.run(
            ["mvn", "-q", "-B", "dependency:copy-dependencies", "-DoutputDirectory=lib"],
            cwd=NEO4J_SRC,
            check=True,
        )
    classes = VAR / "neo4j-launcher"
    if not (classes / "Launcher.class").exists() or (
        (classes / "Launcher.class").stat().st_mtime < (NEO4J_SRC / "Launcher.java").stat().st_mtime
    ):
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["javac", "-cp", f"{lib}/*", "-d", str(classes), str(NEO4J_SRC / "Launcher.java")],
            check=True,
        )
    return lib


def neo4j_up() -> None:
    if pid_alive(VAR / "neo4j.pid") and port_open(NEO4J_PORT):
        log(f"neo4j already running on 127.0.0.1:{NEO4J_PORT}")
        return
    if port_open(NEO4J_PORT):
        sys.exit(f"[services] port {NEO4J_PORT} is taken by another process; set RAG_NEO4J_PORT")
    lib = neo4j_jars()
    home = VAR / "neo4j"
    home.mkdir(parents=True, exist_ok=True)
    (home / "neo4j.conf").write_text(
        NEO4J_CONF.format(port=NEO4J_PORT, pagecache=NEO4J_PAGECACHE, home=home)
    )
    spawn(
        "neo4j",
        [
            "java",
            f"-Xmx{NEO4J_HEAP}",
            f"-Xms{NEO4J_HEAP}",
            "-XX:+UseG1GC",
            "-cp",
            f"{VAR / 'neo4j-launcher'}:{lib}/*",
            "Launcher",
            str(home),
        ],
    )
    wait_until("neo4j", lambda: port_open(NEO4J_PORT), 180)
    neo4j_set_password()


def neo4j_set_password() -> None:
    """A fresh store has neo4j/neo4j with a forced change; set the configured password."""
    from neo4j import GraphDatabase
    from neo4j.exceptions import AuthError, ClientError

    uri = f"bolt://127.0.0.1:{NEO4J_PORT}"
    try:
        with GraphDatabase.driver(uri, auth=("neo4j", NEO4J_PASSWORD)) as driver:
            driver.execute_query("RETURN 1")
            return
    except (AuthError, ClientError):
        pass
    with GraphDatabase.driver(uri, auth=("neo4j", "neo4j")) as driver:
        driver.execute_query(
            "ALTER CURRENT USER SET PASSWORD FROM 'neo4j' TO $new",
            {"new": NEO4J_PASSWORD},
            database_="system",
        )
    log("neo4j password set from NEO4J__PASSWORD")


# --- commands ------------------------------------------------------------------------
def stop(name: str) -> None:
    pidfile = VAR / f"{name}.pid"
    pid = pid_alive(pidfile)
    if pid is None:
        log(f"{name} not running")
        pidfile.unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(60):
        if pid_alive(pidfile) is None:
            break
        time.sleep(0.5)
    else:
        os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    log(f"{name} stopped")


def status() -> int:
    bad = 0
    for name, port in (("milvus", MILVUS_PORT), ("neo4j", NEO4J_PORT)):
        pid = pid_alive(VAR / f"{name}.pid")
        up = port_open(port)
        log(f"{name}: pid={pid} port {port} {'open' if up else 'closed'}")
        bad += not up
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--only", choices=["milvus", "neo4j"], help="act on one service")
    args = parser.parse_args()
    VAR.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else ["milvus", "neo4j"]
    if args.command == "up":
        for name in names:
            {"milvus": milvus_up, "neo4j": neo4j_up}[name]()
        return 0
    if args.command == "down":
        for name in names:
            stop(name)
        return 0
    return status()


if __name__ == "__main__":
    sys.exit(main())
