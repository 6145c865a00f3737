#!/usr/bin/env bash
# The GPU check of issue 18 in one short run (< 5 minutes on one GPU): embedder raw vs. its
# Serve shell at batch 32/64/128 in float32 and float16, reranker pairs/s at 8 concurrent,
# search p50 (query embedding on the GPU + the in-memory hybrid candidates).
# Writes bench/results/gpu_check-<time>.json (or $OUT/gpu_check.json when OUT is set, as on
# the device machine) and prints the tables for bench/README.md ("GPU check").
#   bash bench/gpu_check.sh            # needs .venv (scripts/install.sh) and a CUDA torch
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__}: nothing to check")
print("GPU:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
out=()
[ -n "${OUT:-}" ] && out=(--out "$OUT/gpu_check.json")
HF_HUB_OFFLINE=1 timeout 280 "$PY" -m bench.gpu_check --device cuda "${out[@]}" "$@"
