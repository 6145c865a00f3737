#!/usr/bin/env bash
# One command for a laptop: install, start Milvus Lite + Neo4j + the event bus (nats-server
# with its users, installed when missing) + a local Ray, deploy the gateway with
# serve_config.yaml on 127.0.0.1:8000, start the bus consumer and load the sample corpus.
# Stop everything with scripts/stop.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${RAG_VENV:-$ROOT/.venv}"
VAR="${RAG_VAR_DIR:-$ROOT/var}"
PORT=8000
cd "$ROOT"
bash scripts/install.sh
"$VENV/bin/python" scripts/services.py up
# The event bus is part of the gateway: install nats-server when missing (apt-get).
RAG_INSTALL_PACKAGES="${RAG_INSTALL_PACKAGES:-1}" "$VENV/bin/python" scripts/services.py up --only nats
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
# Teams indexed by an earlier version with another embedding model (the default became
# ONNX int8 in issue 36) are refused by the gateway until reindexed: reindex them now, from
# the source registry, one after another (nothing to do on a fresh machine).
"$VENV/bin/python" -m batch_ingest.reindex --outdated --engine local --log-every 30 \
  || echo "[start] some outdated teams could not be reindexed (see above); they stay refused" >&2
# The sample corpus needs a credential that may write its teams. Development mode (the
# default) needs none; with AUTH__MODE=jwt a local HS256 token is minted when
# AUTH__HS256_SECRET is set, otherwise the load is skipped (the gateway runs either way).
sample_args=(--url "http://127.0.0.1:$PORT")
load_sample=1
if [ "${AUTH__MODE:-dev}" = "jwt" ]; then
  if [ -n "${AUTH__HS256_SECRET:-}" ]; then
    token=$("$VENV/bin/python" -m serve_app.auth mint-token --sub rag-start-sample \
      --team dao_greenfood=owner --team dao_energy=owner --team dao_daarion=owner)
    sample_args+=(--token "$token")
  else
    load_sample=0
    echo "[start] AUTH__MODE=jwt without AUTH__HS256_SECRET: skipping the sample corpus load" \
      "(load it later with: python -m batch_ingest.load_jsonl --token <a token that may" \
      "write dao_greenfood, dao_energy and dao_daarion>)"
  fi
fi
if [ "$load_sample" = 1 ]; then
  "$VENV/bin/python" -m batch_ingest.load_jsonl "${sample_args[@]}"
fi
# The bus consumer (NATS JetStream → the same ingestion pipeline), with its own nkey.
bash scripts/consumer.sh up
auth_header=""
if [ -n "${token:-}" ]; then
  # The minted token (1 h) in a file only the user can read, for the example below.
  (umask 077 && printf '%s' "$token" > "$VAR/sample_token")
  auth_header=" -H \"authorization: Bearer \$(cat $VAR/sample_token)\""
elif [ "${AUTH__MODE:-dev}" = "jwt" ]; then
  auth_header=" -H 'authorization: Bearer <your token>'"
fi
cat <<MSG

RAG Gateway is up on http://127.0.0.1:$PORT  (API docs: /docs, readiness: /readyz)
Try:
  curl -s http://127.0.0.1:$PORT/rag/search_docs -H 'content-type: application/json'$auth_header \\
    -d '{"team_id": "dao_greenfood", "query": "which projects use Milvus?", "top_k": 3}'
Publish to the bus (a producer credential bound to its team, then one event):
  $VENV/bin/python -m batch_ingest.bus_auth issue demo --teams dao_greenfood
  $VENV/bin/python -m batch_ingest.publish --seed $VAR/nats/auth/producers/demo.nk \\
    --team dao_greenfood --doc-id bus-note-1 --text "The cold store runs on the solar array." --wait
Stop everything: bash scripts/stop.sh
MSG
