#!/usr/bin/env bash
# Stop the bus consumer, the gateway, the local Ray cluster and the embedded services (data
# stays in var/).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${RAG_VENV:-$ROOT/.venv}"
cd "$ROOT"
bash scripts/consumer.sh down
bash scripts/ray_local.sh down
"$VENV/bin/python" scripts/services.py down
