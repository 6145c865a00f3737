#!/usr/bin/env bash
# Where the CPU goes under search load: runs bench_search_real at 8 concurrent requests and,
# over a window of the measured reps, sums each process's CPU seconds (user + system, from
# psutil). On a saturated machine throughput is cores / CPU per request, so an A/B of two
# commits tells a code cost (one component's share grows) from the VM's speed drifting (every
# share the same, the unchanged Ray proxy costing more per request too).
#
#   bash bench/cpu_shares.sh LABEL [WINDOW_S]      (run from the checkout to measure)
#   CPU_SHARES_SPY=1 ...                           also py-spy each Serve replica (raw stacks)
#
# Writes bench/results/cpu_shares-LABEL-<UTC stamp>.txt (and spy-*.txt beside it).
set -euo pipefail
label=${1:?usage: bench/cpu_shares.sh LABEL [WINDOW_S]}
window=${2:-40}
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$root/bench/results/cpu_shares-$label-$stamp.txt"
log=$(mktemp)
mkdir -p "$root/bench/results"

snapshot() {  # pid, CPU seconds (user + system), command line of every process
  "$py" - <<'PY'
import psutil
for p in psutil.process_iter(["cmdline", "cpu_times"]):
    times, cmd = p.info["cpu_times"], " ".join(p.info["cmdline"] or ())[:90]
    if times is not None:
        print(p.pid, times.user + times.system, cmd.strip() or "-")
PY
}

cd "$root"
PYTHONPATH="$root" "$py" bench/bench_search_real.py --grow 0 --after-ingest 0 \
  --concurrency 8 --requests 400 --reps 8 >"$log" 2>&1 &
bench=$!
echo "[cpu_shares] waiting for the gateway to warm up (log $log)"
until grep -q "warm after" "$log"; do
  kill -0 "$bench" 2>/dev/null || { echo "[cpu_shares] benchmark exited early"; tail "$log"; exit 1; }
  sleep 1
done
sleep 3
snapshot >"$log.before"
t0=$(date +%s.%N)
if [[ -n "${CPU_SHARES_SPY:-}" ]]; then
  for pid in $(pgrep -f "ServeReplica|ProxyActor"); do
    name=$(tr '\0' ' ' </proc/"$pid"/cmdline | grep -o "ServeReplica:[^ .]*\|ProxyActor" | tr ':' '_' | head -1)
    "$root/.venv/bin/py-spy" record --nonblocking --rate 40 --duration "$window" --format raw \
      -o "$root/bench/results/spy-$label-$stamp-$name.txt" --pid "$pid" >/dev/null 2>&1 &
  done
fi
echo "[cpu_shares] measuring ${window}s"
sleep "$window"
snapshot >"$log.after"
t1=$(date +%s.%N)
wait "$bench"
"$py" - "$label" "$t0" "$t1" "$log" >"$out" <<'PY'
import re, sys
label, t0, t1, log = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
before = {line.split(" ", 2)[0]: float(line.split(" ", 2)[1]) for line in open(log + ".before")}
rows = []
for line in open(log + ".after"):
    pid, seconds, cmd = line.rstrip("\n").split(" ", 2)
    if pid in before:
        rows.append((float(seconds) - before[pid], cmd))
rows.sort(reverse=True)
total = sum(r[0] for r in rows)
text = open(log).read()
rates = [float(x) for x in re.findall(r"c=8 rep \d+: .*?, ([\d.]+) req/s", text)]
print(f"{label}: window {t1 - t0:.1f} s, CPU {total:.1f} s; req/s per rep {rates}")
print(next((l for l in text.splitlines() if "wrote" in l), ""))
for seconds, cmd in rows[:12]:
    print(f"{seconds:7.2f} s {100 * seconds / total:5.1f} %  {cmd}")
PY
rm -f "$log" "$log.before" "$log.after"
cat "$out"
echo "[cpu_shares] wrote $out"
