#!/usr/bin/env bash
# The test command: install, start Milvus Lite + Neo4j, run the unit, integration and Serve
# suites (the Serve suite in its own process: it owns a Ray cluster), stop what it started.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${RAG_VENV:-$ROOT/.venv}"
cd "$ROOT"
bash scripts/install.sh || exit 1

started=""
if ! "$VENV/bin/python" scripts/services.py status >/dev/null 2>&1; then
  "$VENV/bin/python" scripts/services.py up || exit 1
  started=1
fi
cleanup() { [ -n "$started" ] && "$VENV/bin/python" scripts/services.py down; }
trap cleanup EXIT

export RAG_TEST_RUN_ID="${RAG_TEST_RUN_ID:-$(date +%s)}"
"$VENV/bin/ruff" check . || exit 1
"$VENV/bin/python" -m pytest tests/unit tests/integration "$@"
first=$?
"$VENV/bin/python" -m pytest tests/serve "$@"
second=$?
[ $first -eq 0 ] && [ $second -eq 0 ]
