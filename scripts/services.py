#!/usr/bin/env python3
"""Start, stop and check the embedded backing services on 127.0.0.1.

    python scripts/services.py up       # Milvus Lite, Neo4j 5.26, PostgreSQL, NATS, Redis
    python scripts/services.py status
    python scripts/services.py down

Milvus Lite runs as its own server process so that every Serve replica and batch job shares
one store. Neo4j is the real 5.26 Community server, resolved from Maven Central by
scripts/neo4j/pom.xml and started by scripts/neo4j/Launcher.java, with a capped heap and page
cache. PostgreSQL (for the audit log tests; the gateway's default audit store is SQLite) is
the distribution's server binaries (Debian package ``postgresql``, installed with apt-get when
missing and CI=true or RAG_INSTALL_PACKAGES=1, as scripts/test.sh sets) running a private
cluster in var/postgres on 127.0.0.1:5433 with tiny memory settings; as root it runs as the
``postgres`` system user. State, logs and pid files live in $RAG_VAR_DIR (default ./var).

    python scripts/services.py url postgres    # the SQLAlchemy URL of the audit database
    python scripts/services.py url nats        # nats://127.0.0.1:4222
    python scripts/services.py url redis       # redis://127.0.0.1:6380/0

NATS (the event bus of batch_ingest.consumer) is the Debian package ``nats-server`` (2.9.x,
installed with apt-get like PostgreSQL) with JetStream on, file storage in var/nats,
on 127.0.0.1:4222, no anonymous connection: nkey users in var/nats/auth (the consumer's and
operators' seeds made on the first start, producers bound to their teams added with
``python -m batch_ingest.bus_auth issue NAME --teams T``).

Redis (the shared backend of the semantic cache, serve_app/search/cache/store.py) is the Debian
package ``redis-server`` (7.0.x, installed with apt-get like PostgreSQL), run in the
foreground with its own config in var/redis: 127.0.0.1:6380 (not 6379, where a system Redis
may listen), no persistence (a cache), ``maxmemory 256mb`` with ``allkeys-lru`` eviction.
NATS, PostgreSQL and Redis are optional for plain ``up`` (a warning when the package is
missing and may not be installed) and required with ``--only``.

Environment: RAG_VAR_DIR, RAG_MILVUS_PORT (19530), RAG_NEO4J_PORT (7687),
NEO4J__PASSWORD (rag-gateway-dev), RAG_NEO4J_HEAP (768m), RAG_NEO4J_PAGECACHE (128m),
RAG_NATS_PORT (4222), RAG_REDIS_PORT (6380), RAG_POSTGRES_PORT (5433),
RAG_POSTGRES_PASSWORD (rag-audit-dev), RAG_POSTGRES_BIN (the newest
/usr/lib/postgresql/<version>/bin).
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
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
POSTGRES_PORT = int(os.environ.get("RAG_POSTGRES_PORT", "5433"))
POSTGRES_USER = "rag_audit"
POSTGRES_DB = "rag_audit"
POSTGRES_PASSWORD = os.environ.get("RAG_POSTGRES_PASSWORD", "rag-audit-dev")
NATS_PORT = int(os.environ.get("RAG_NATS_PORT", "4222"))
REDIS_PORT = int(os.environ.get("RAG_REDIS_PORT", "6380"))
SERVICES = ("milvus", "neo4j", "postgres", "nats", "redis")


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
    pid = pid_alive(VAR / "milvus.pid")
    if pid and port_open(MILVUS_PORT):
        log(f"milvus already running on 127.0.0.1:{MILVUS_PORT}")
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if cmdline and b"lite_server" not in cmdline:
            log(
                "milvus was started without deployments.vector_store.lite_server: a read during"
                " a flush can miss acknowledged writes; restart it: scripts/services.py down"
                " --only milvus && scripts/services.py up --only milvus"
            )
        return
    if port_open(MILVUS_PORT):
        sys.exit(f"[services] port {MILVUS_PORT} is taken by another process; set RAG_MILVUS_PORT")
    # Milvus Lite's own server, its reads kept out of a flush's gap (a read during another
    # client's flush can miss acknowledged writes: deployments/vector_store/lite_server.py).
    # Always pass --host: the default binds every interface.
    spawn(
        "milvus",
        [
            sys.executable,
            "-m",
            "deployments.vector_store.lite_server",
            "server",
            "--data-dir",
            str(VAR / "milvus"),
            "--host",
            "127.0.0.1",
            "--port",
            str(MILVUS_PORT),
        ],
        cwd=ROOT,
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


# --- PostgreSQL -------------------------------------------------------------------------


def pg_base() -> Path:
    """The cluster's folder: var/postgres, or, when running as root and the postgres user
    cannot reach var/ (a checkout under a private home), a folder under /var/tmp."""
    base = VAR / "postgres"
    if os.geteuid() != 0:
        return base
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return base
    reachable = subprocess.run(as_pg_user(["test", "-x", str(VAR)]), capture_output=True)
    if reachable.returncode == 0:
        return base
    import hashlib

    digest = hashlib.sha256(str(VAR).encode()).hexdigest()[:10]
    return Path("/var/tmp") / f"rag-gateway-postgres-{digest}"


def pg_data() -> Path:
    return pg_base() / "data"


def pg_run() -> Path:
    return pg_base() / "run"  # the unix socket


def pg_log() -> Path:
    return pg_base() / "postgres.log"


PG_CONF = """\
# Written by scripts/services.py; edit the script, not this file.
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{run}'
shared_buffers = 32MB
work_mem = 2MB
maintenance_work_mem = 16MB
max_connections = 40
max_wal_size = 128MB
min_wal_size = 32MB
dynamic_shared_memory_type = posix
fsync = on
logging_collector = off
"""


def postgres_url() -> str:
    return (
        f"postgresql+psycopg://{POSTGRES_USER}:{POSTGRES_PASSWORD}"
        f"@127.0.0.1:{POSTGRES_PORT}/{POSTGRES_DB}"
    )


def postgres_bin() -> Path | None:
    if os.environ.get("RAG_POSTGRES_BIN"):
        return Path(os.environ["RAG_POSTGRES_BIN"])

    def version(initdb: str) -> int:
        name = Path(initdb).parent.parent.name
        return int(name) if name.isdigit() else 0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PackageMissing(Exception):
    """A Debian package a service needs is not installed, and may not be installed here."""


def apt_install(package: str, what: str) -> None:
    """Install ``package`` with apt-get when allowed: CI=true, or RAG_INSTALL_PACKAGES=1
    (scripts/test.sh sets it, so its one command works on a fresh machine), as root or with
    password-less sudo.

    Raises:
        PackageMissing: not allowed, or no way to become root without a prompt.
    """
    cmd = f"apt-get update && apt-get install -y {package}"
    allowed = os.environ.get("CI", "").lower() == "true" or os.environ.get(
        "RAG_INSTALL_PACKAGES", ""
    ) in ("1", "true")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if allowed and sudo and subprocess.run([*sudo, "true"], capture_output=True).returncode:
        allowed = False
    if not allowed:
        raise PackageMissing(
            f"{what} not found; install it with: {cmd} (scripts/services.py runs that itself "
            "with CI=true or RAG_INSTALL_PACKAGES=1, as root or with password-less sudo)"
        )
    log(f"{what} missing; running: {cmd}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update"], check=True, env=env)
    subprocess.run([*sudo, "apt-get", "install", "-y", package], check=True, env=env)


def postgres_install() -> Path:
    bindir = postgres_bin()
    if bindir is not None and (bindir / "pg_ctl").exists():
        return bindir
    apt_install("postgresql", "PostgreSQL server binaries")
    bindir = postgres_bin()
    if bindir is None:
        sys.exit("[services] apt-get installed postgresql but no initdb was found")
    return bindir


def as_pg_user(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the 'postgres' system user."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *argv]
    return ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(argv)]


def pg_own(path: Path) -> None:
    """As root, hand the cluster's folders to the postgres user (its parents stay readable)."""
    if os.geteuid() != 0:
        return
    import pwd

    pw = pwd.getpwnam("postgres")
    for root, dirs, files in os.walk(path):
        os.chown(root, pw.pw_uid, pw.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid, follow_symlinks=False)


def postgres_pid() -> int | None:
    try:
        return int((pg_data() / "postmaster.pid").read_text().splitlines()[0])
    except (FileNotFoundError, ValueError, IndexError, PermissionError):
        return None


def postgres_running(bindir: Path | None = None) -> bool:
    bindir = bindir or postgres_bin()
    if bindir is None or not (pg_data() / "PG_VERSION").exists():
        return False
    result = subprocess.run(
        as_pg_user([str(bindir / "pg_ctl"), "status", "-D", str(pg_data())]),
        capture_output=True,
    )
    return result.returncode == 0


def postgres_up(required: bool = True) -> None:
    """Start the audit database. ``required=False`` (plain ``up``, as scripts/start.sh calls
    it): missing binaries are a warning, the gateway's default audit store is SQLite."""
    try:
        bindir = postgres_install()
    except PackageMissing as exc:
        if required:
            sys.exit(f"[services] {exc}")
        log(f"WARNING: postgres skipped: {exc}")
        return
    if postgres_running(bindir) and port_open(POSTGRES_PORT):
        log(f"postgres already running on 127.0.0.1:{POSTGRES_PORT}")
        return
    if port_open(POSTGRES_PORT):
        sys.exit(
            f"[services] port {POSTGRES_PORT} is taken by another process; set RAG_POSTGRES_PORT"
        )
    base = pg_base()
    pg_run().mkdir(parents=True, exist_ok=True)
    pg_log().parent.mkdir(parents=True, exist_ok=True)
    pg_log().touch()
    if not (pg_data() / "PG_VERSION").exists():
        pg_data().mkdir(parents=True, exist_ok=True)
        pg_own(base)
        log(f"initdb {pg_data()}")
        subprocess.run(
            as_pg_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(pg_data()),
                    "-U",
                    "postgres",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    conf = PG_CONF.format(port=POSTGRES_PORT, run=pg_run())
    (pg_data() / "postgresql.auto.conf").write_text(conf)
    pg_own(base)
    # Local socket connections are trusted: only the cluster's owner may reach the socket.
    pg_run().chmod(0o700)
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chown(pg_log(), pw.pw_uid, pw.pw_gid)
    result = subprocess.run(
        as_pg_user(
            [str(bindir / "pg_ctl"), "start", "-w", "-t", "60"]
            + ["-D", str(pg_data()), "-l", str(pg_log())]
        ),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        tail = pg_log().read_text(errors="replace")[-2000:]
        sys.exit(f"[services] postgres did not start: {result.stderr.strip()}\nlog tail:\n{tail}")
    log(f"postgres started (data {pg_data()}, log {pg_log()})")
    postgres_provision(bindir)
    log("postgres ready")


def postgres_provision(bindir: Path) -> None:
    """Create the audit role and database once (idempotent), over the unix socket."""
    psql = [str(bindir / "psql"), "-h", str(pg_run()), "-p", str(POSTGRES_PORT), "-U", "postgres"]
    pw = POSTGRES_PASSWORD.replace("'", "''")
    u = POSTGRES_USER
    role_sql = (
        f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{u}') THEN "
        f"CREATE ROLE {u} LOGIN PASSWORD '{pw}'; ELSE ALTER ROLE {u} PASSWORD '{pw}'; END IF; "
        "END$$;"
    )
    subprocess.run(
        as_pg_user([*psql, "-q", "-v", "ON_ERROR_STOP=1", "-d", "postgres", "-c", role_sql]),
        check=True,
    )
    exists = subprocess.run(
        as_pg_user(
            [
                *psql,
                "-tAq",
                "-d",
                "postgres",
                "-c",
                f"SELECT 1 FROM pg_database WHERE datname = '{POSTGRES_DB}'",
            ]
        ),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if exists != "1":
        subprocess.run(
            as_pg_user(
                [
                    *psql,
                    "-q",
                    "-d",
                    "postgres",
                    "-c",
                    f"CREATE DATABASE {POSTGRES_DB} OWNER {POSTGRES_USER}",
                ]
            ),
            check=True,
        )
        log(f"postgres database {POSTGRES_DB} created (user {POSTGRES_USER})")


def postgres_down() -> None:
    bindir = postgres_bin()
    if bindir is None or not postgres_running(bindir):
        log("postgres not running")
        return
    subprocess.run(
        as_pg_user([str(bindir / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(pg_data())]),
        check=True,
        capture_output=True,
    )
    log("postgres stopped")


# --- NATS JetStream ---------------------------------------------------------------------
def nats_url() -> str:
    return f"nats://127.0.0.1:{NATS_PORT}"


def system_exe(name: str) -> str | None:
    """A Debian-packaged server binary (in /usr/sbin or /usr/bin, which a normal user's PATH
    may lack)."""
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None
    )


def package_exe(name: str) -> str:
    """``name``'s binary, apt-get installing the Debian package of that name when missing."""
    exe = system_exe(name)
    if exe:
        return exe
    apt_install(name, name)
    exe = system_exe(name)
    if exe is None:
        sys.exit(f"[services] apt-get installed {name} but it was not found")
    return exe


def server_to_start(name: str, port: int, package: str, required: bool) -> str | None:
    """The binary to start ``name`` with, or None when it already runs (or, not
    ``required``, its package cannot be installed: a warning). A foreign process on the port
    stops the script."""
    if pid_alive(VAR / f"{name}.pid") and port_open(port):
        log(f"{name} already running on 127.0.0.1:{port}")
        return None
    if port_open(port):
        sys.exit(f"[services] port {port} is taken by another process; set RAG_{name.upper()}_PORT")
    try:
        return package_exe(package)
    except PackageMissing as exc:
        if required:
            sys.exit(f"[services] {exc}")
        log(f"WARNING: {name} skipped: {exc}")
        return None


def nats_jetstream_ready() -> bool:
    """The server's INFO line (sent on connect) says whether JetStream is on."""
    with socket.create_connection(("127.0.0.1", NATS_PORT), timeout=2) as sock:
        info = sock.recv(4096).decode(errors="replace")
    return info.startswith("INFO ") and '"jetstream":true' in info


NATS_CONF = """\
# Written by scripts/services.py; edit the script, not this file.
listen: 127.0.0.1:{port}
http_port: 0
# As in deploy/k8s: an event carries a whole document (ingest.max_document_chars).
max_payload: 8MB
jetstream {{
  store_dir: "{store}"
  max_memory_store: 64MB
  max_file_store: 2GB
}}
# Users (nkeys): the consumer, operators and producers bound to their teams; no anonymous
# connection. python -m batch_ingest.bus_auth issue NAME --teams T adds a producer.
include "auth/auth.conf"
"""


def nats_up(required: bool = True) -> None:
    """Start NATS. ``required=False`` (plain ``up``): a missing binary is a warning, only the
    bus consumer needs it."""
    exe = server_to_start("nats", NATS_PORT, "nats-server", required)
    if exe is None:
        return
    home = VAR / "nats"
    (home / "jetstream").mkdir(parents=True, exist_ok=True)
    conf = home / "nats.conf"
    # The seeds of the consumer and of operators (made once) and the users' block.
    sys.path.insert(0, str(ROOT))
    from batch_ingest.bus_auth import BusAuth

    BusAuth(home / "auth").ensure_service_users()
    # The storage directory in the file, not a flag: a reload (a producer issued or revoked)
    # refuses a storage directory that differs from the file's.
    conf.write_text(NATS_CONF.format(port=NATS_PORT, store=home / "jetstream"))
    spawn("nats", [exe, "-c", str(conf), "-js", "-a", "127.0.0.1", "-p", str(NATS_PORT)])
    wait_until("nats", nats_jetstream_ready, 30)


# --- Redis (the semantic cache) ----------------------------------------------------------
def redis_url() -> str:
    return f"redis://127.0.0.1:{REDIS_PORT}/0"


def redis_ping() -> bool:
    """An inline ``PING`` answers ``+PONG`` once the server accepts commands."""
    with socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(64).startswith(b"+PONG")


# The log goes where spawn() sends the other services' output, so that a failed start-up
# shows its tail; the pid file is spawn()'s too (the server runs in the foreground).
REDIS_CONF = """\
# Written by scripts/services.py; edit the script, not this file.
bind 127.0.0.1
port {port}
protected-mode yes
daemonize no
dir "{home}"
pidfile "{pidfile}"
logfile "{logfile}"
save ""
appendonly no
maxmemory 256mb
maxmemory-policy allkeys-lru
"""


def redis_up(required: bool = True) -> None:
    """Start Redis. ``required=False`` (plain ``up``): a missing binary is a warning, only the
    shared semantic cache (cache.backend=redis) needs it."""
    exe = server_to_start("redis", REDIS_PORT, "redis-server", required)
    if exe is None:
        return
    home = VAR / "redis"
    home.mkdir(parents=True, exist_ok=True)
    conf = home / "redis.conf"
    conf.write_text(
        REDIS_CONF.format(
            port=REDIS_PORT,
            home=home,
            pidfile=VAR / "redis.pid",
            logfile=VAR / "log" / "redis.log",
        )
    )
    spawn("redis", [exe, str(conf)])
    wait_until("redis", redis_ping, 30)


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


def status(names: list[str] | tuple[str, ...] = SERVICES) -> int:
    bad = 0
    ports = {
        "milvus": MILVUS_PORT,
        "neo4j": NEO4J_PORT,
        "postgres": POSTGRES_PORT,
        "nats": NATS_PORT,
        "redis": REDIS_PORT,
    }
    for name, port in ((n, ports[n]) for n in names):
        pid = pid_alive(VAR / f"{name}.pid") if name != "postgres" else postgres_pid()
        up = port_open(port)
        log(f"{name}: pid={pid} port {port} {'open' if up else 'closed'}")
        bad += not up
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "url"])
    parser.add_argument("service", nargs="?", choices=["postgres", "nats", "redis"], help="for url")
    parser.add_argument("--only", choices=SERVICES, help="act on one service")
    args = parser.parse_args()
    if args.command == "url":
        urls = {"nats": nats_url, "redis": redis_url}
        print(urls.get(args.service, postgres_url)())
        return 0
    VAR.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else list(SERVICES)
    if args.command == "up":
        for name in names:
            if name == "postgres":
                postgres_up(required=bool(args.only))
            elif name == "nats":
                nats_up(required=bool(args.only))
            elif name == "redis":
                redis_up(required=bool(args.only))
            else:
                {"milvus": milvus_up, "neo4j": neo4j_up}[name]()
        return 0
    if args.command == "down":
        for name in names:
            postgres_down() if name == "postgres" else stop(name)
        return 0
    return status(names)


if __name__ == "__main__":
    sys.exit(main())
