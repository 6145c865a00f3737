#!/usr/bin/env bash
# The test command: install, start Milvus Lite + Neo4j + PostgreSQL (audit log) + NATS + Redis
# (semantic cache), run the unit, integration, security and Serve suites (the Serve suite in
# its own process beside the others: it owns a Ray cluster), stop what it started.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${RAG_VENV:-$ROOT/.venv}"
cd "$ROOT"
# Each phase prints its start time, so a slow CI run shows where the minutes went.
phase() { echo "[test.sh $(date -u +%H:%M:%S)] $*"; }
phase install
bash scripts/install.sh || exit 1
# The tests need PostgreSQL, nats-server and redis-server: scripts/services.py installs them
# with apt-get when they are missing (as root or with password-less sudo;
# RAG_INSTALL_PACKAGES=0 refuses).
export RAG_INSTALL_PACKAGES="${RAG_INSTALL_PACKAGES:-1}"

# Start only the services that are not running, and stop only those at the end.
started=()
serve_pid=""
mypy_pid=""
cleanup() {
  # Interrupted while the Serve suite runs in the background: stop it before its services.
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null; fi
  if [ -n "$mypy_pid" ]; then kill "$mypy_pid" 2>/dev/null; wait "$mypy_pid" 2>/dev/null; fi
  for name in "${started[@]}"; do "$VENV/bin/python" scripts/services.py down --only "$name"; done
}
trap cleanup EXIT
# The niceness of the unit, integration and security suites and of mypy when they run beside
# the Serve suite (see below).
NICE="${RAG_TEST_NICE:-15}"
phase "ruff, lint-imports; mypy in the background"
"$VENV/bin/ruff" check . || exit 1
# The import layering (pyproject.toml, [tool.importlinter]): serve_app -> batch_ingest ->
# deployments, never back up, no cycles; bench/ and the product never import tests/.
"$VENV/bin/lint-imports" --no-cache || exit 1
# Types of the three packages (pyproject.toml, [tool.mypy]; the pydantic plugin): ~100 s of
# CPU on a fresh clone, so it runs beside the services' start and the suites, its output in
# var/log/mypy.log, printed and counted at the end.
mypy_log="$ROOT/var/log/mypy.log"
mkdir -p "$(dirname "$mypy_log")"
nice -n "$NICE" "$VENV/bin/mypy" > "$mypy_log" 2>&1 &
mypy_pid=$!
phase services
for name in milvus neo4j postgres nats redis; do
  if ! "$VENV/bin/python" scripts/services.py status --only "$name" >/dev/null 2>&1; then
    "$VENV/bin/python" scripts/services.py up --only "$name" || exit 1
    started+=("$name")
  fi
done

export RAG_TEST_RUN_ID="${RAG_TEST_RUN_ID:-$(date +%s)}"
# The audit log's PostgreSQL tests (tests/integration/test_audit_postgres.py) use this URL.
export RAG_TEST_POSTGRES_URL="${RAG_TEST_POSTGRES_URL:-$("$VENV/bin/python" scripts/services.py url postgres)}"
# The bus tests (tests/integration/test_events_nats.py) use this JetStream server.
export RAG_TEST_NATS_URL="${RAG_TEST_NATS_URL:-$("$VENV/bin/python" scripts/services.py url nats)}"
# The semantic cache's Redis store tests (tests/integration/test_cache_redis.py) use this Redis.
export RAG_TEST_REDIS_URL="${RAG_TEST_REDIS_URL:-$("$VENV/bin/python" scripts/services.py url redis)}"
# The Serve suite (its own process: it owns a Ray cluster) runs beside the others, its output
# in var/log/pytest-serve.log and printed when both are done: both wait on services and
# replicas more than they compute, and side by side they took 16:49 where one after the other
# took ~27 minutes (bench/README.md, "CI layout"). RAG_TEST_SERIAL=1 runs one after the other.
serve_log="$ROOT/var/log/pytest-serve.log"
mkdir -p "$(dirname "$serve_log")"
if [ "${RAG_TEST_SERIAL:-0}" = 1 ]; then
  phase "pytest: unit, integration, security"
  "$VENV/bin/python" -m pytest tests/unit tests/integration tests/security "$@"
  first=$?
  phase "pytest: serve"
  "$VENV/bin/python" -m pytest tests/serve "$@"
  second=$?
else
  phase "pytest: serve in the background (output: $serve_log, printed at the end)"
  "$VENV/bin/python" -m pytest tests/serve "$@" > "$serve_log" 2>&1 &
  serve_pid=$!
  # Ray starts the Serve replicas at niceness 15 (its worker_niceness): beside a pytest at 0
  # they got the CPU last, and on a slow 2-vCPU VM a new replica's first reads ran past the
  # gateway's own 10 s store and 8 s graph deadlines (503). The other suites stand for
  # nothing a gateway's node runs, so they take the replicas' niceness; the services both
  # suites use (Milvus Lite, Neo4j, ...) stay at 0, as on a user's node.
  phase "pytest: unit, integration, security (nice $NICE)"
  nice -n "$NICE" "$VENV/bin/python" -m pytest tests/unit tests/integration tests/security "$@"
  first=$?
  phase "unit, integration, security done (exit $first); waiting for the Serve suite"
  wait "$serve_pid"
  second=$?
  serve_pid=""
  phase "pytest: serve (exit $second), its output:"
  cat "$serve_log"
fi
wait "$mypy_pid"
typed=$?
mypy_pid=""
phase "mypy (exit $typed), its output:"
cat "$mypy_log"
phase "done (unit etc. exit $first, serve exit $second, mypy exit $typed)"
[ $first -eq 0 ] && [ $second -eq 0 ] && [ $typed -eq 0 ]
