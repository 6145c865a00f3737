#!/usr/bin/env bash
# One command for a laptop: install, start Milvus Lite + Neo4j + a local Ray, deploy the
# gateway with serve_config.yaml on 127.0.0.1:8000 and load the sample corpus.
# Stop everything with scripts/stop.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${RAG_VENV:-$ROOT/.venv}"
VAR="${RAG_VAR_DIR:-$ROOT/var}"
PORT=8000
cd "$ROOT"
bash scripts/install.sh
"$VENV/bin/python" scripts/services.py up
bash scripts/ray_local.sh up
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$VAR/ray_auth_token"
echo "[start] deploying serve_config.yaml"
"$VENV/bin/serve" deploy serve_config.yaml -a http://127.0.0.1:8265
echo "[start] waiting for http://127.0.0.1:$PORT/readyz (model load ~20-60 s)"
for _ in $(seq 1 180); do
  code=$(curl -s -o "$VAR/readyz.json" -w '%{http_code}' "http://127.0.0.1:$PORT/readyz" || true)
  [ "$code" = 200 ] && break
  sleep 2
done
if [ "$code" != 200 ]; then
  echo "[start] gateway not ready: $(cat "$VAR/readyz.json" 2>/dev/null)" >&2
  exit 1
fi
"$VENV/bin/python" -m batch_ingest.load_jsonl --url "http://127.0.0.1:$PORT"
cat <<MSG

RAG Gateway is up on http://127.0.0.1:$PORT  (API docs: /docs, readiness: /readyz)
Try:
  curl -s http://127.0.0.1:$PORT/rag/search_docs -H 'content-type: application/json' \\
    -d '{"team_id": "dao_greenfood", "query": "which projects use Milvus?", "top_k": 3}'
Stop everything: bash scripts/stop.sh
MSG
