#!/usr/bin/env bash
# The bus consumer (python -m batch_ingest.consumer) as a background process of the
# one-machine setup: `up` starts it (log var/log/consumer.log, pid var/consumer.pid) unless it
# runs, `down` stops it gracefully (SIGTERM: it finishes and acks its batch), `status`.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${RAG_VENV:-$ROOT/.venv}"
VAR="${RAG_VAR_DIR:-$ROOT/var}"
PID="$VAR/consumer.pid"
LOG="$VAR/log/consumer.log"
cd "$ROOT"

running() { [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null; }

case "${1:-status}" in
  up)
    if running; then
      echo "[consumer] running (pid $(cat "$PID"))"
      exit 0
    fi
    mkdir -p "$VAR/log"
    # Its Prometheus metrics (lag, dead letters, events by result) on 127.0.0.1:9464.
    nohup "$VENV/bin/python" -m batch_ingest.consumer --log-format text \
      --metrics-port "${RAG_CONSUMER_METRICS_PORT:-9464}" >>"$LOG" 2>&1 &
    echo $! >"$PID"
    # It connects (with var/nats/auth/consumer.nk) and creates its stream within seconds.
    for _ in $(seq 1 60); do
      grep -q "consuming " "$LOG" 2>/dev/null && break
      running || break
      sleep 1
    done
    if ! running; then
      echo "[consumer] did not start; the end of $LOG:" >&2
      tail -n 20 "$LOG" >&2
      exit 1
    fi
    echo "[consumer] started (pid $(cat "$PID"), log $LOG)"
    ;;
  down)
    if running; then
      kill -TERM "$(cat "$PID")"
      for _ in $(seq 1 60); do running || break; sleep 0.5; done
      running && kill -KILL "$(cat "$PID")"
      echo "[consumer] stopped"
    fi
    rm -f "$PID"
    ;;
  status)
    if running; then echo "[consumer] running (pid $(cat "$PID"))"; else echo "[consumer] stopped"; fi
    ;;
  *)
    echo "usage: scripts/consumer.sh up|down|status" >&2
    exit 2
    ;;
esac
