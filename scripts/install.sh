#!/usr/bin/env bash
# Create .venv and install the gateway with its pinned dependencies; resolve the Neo4j jars.
# Idempotent: a second run only checks. Used by scripts/start.sh and scripts/test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${RAG_VENV:-$ROOT/.venv}"
cd "$ROOT"
command -v java >/dev/null || { echo "java (17+) is required for the local Neo4j" >&2; exit 1; }
command -v mvn >/dev/null || { echo "mvn is required to fetch the Neo4j jars" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV"
  python3 -m venv "$VENV"
fi
stamp="$VENV/.rag-gateway-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[install] installing Python dependencies (first run downloads torch: several minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip uv
  # uv (from PyPI, into the venv) fetches and unpacks the wheels in parallel: torch and its
  # CUDA libraries are most of the download. pip does the same job when uv cannot.
  if ! UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-180}" "$VENV/bin/uv" pip install -q \
      --python "$VENV/bin/python" -e ".[test,bench]"; then
    echo "[install] uv failed; installing with pip"
    "$VENV/bin/python" -m pip install -q -e ".[test,bench]"
  fi
  touch "$stamp"
fi
if ! ls scripts/neo4j/lib/neo4j-kernel-*.jar >/dev/null 2>&1; then
  echo "[install] resolving Neo4j 5.26 jars from Maven Central"
  (cd scripts/neo4j && mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib)
fi
echo "[install] ok ($("$VENV/bin/python" --version), $(java -version 2>&1 | head -1))"
