#!/usr/bin/env bash
# Whether settling Python's collector (option gc-freeze) takes the full-collection pauses out
# of the runs (issues 50 and 55), in one call on a freshly started nvidia-h100-x2 (GPUs 0,1):
# the ten-run probe with the defaults first (fresh host), dask-cuda's, then the bench's
# W1, W3, W4 (--runs 5 --timeline, dask-cuda beside it), then both again with
# --no-gc-freeze. Each side's bench log prints "gc pauses" per workload and process.
#   bash .whl/install-wheels.sh .whl && export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
#   bash benchmarks/gpu-host/gc-freeze.sh
# Under $OUT: gc-freeze.tar.gz (logs, bench json/md/png, probe json). Short table last.
set -uo pipefail
out=${OUT:-/tmp/gc-freeze}
files="$out/files"
mkdir -p "$files"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
devices=${DEVICES:-0,1}
log="$files/gc-freeze.log"
{ date -u +%FT%TZ; nvidia-smi -L; free -g | head -2; git log --oneline -1 2>/dev/null; } >"$log" 2>&1
probe() {  # name rig [options]
  local name=$1 rig=$2; shift 2
  echo "== probe $name" | tee -a "$log"
  timeout -k 10 150 python3 benchmarks/gpu-host/ten_runs.py --rig "$rig" --devices "$devices" "$@" \
    >"$files/ten-runs-$name.json" 2>"$files/ten-runs-$name.log"
  echo "   rc=$?" | tee -a "$log"
}
bench() {  # name [flags]
  local name=$1; shift
  echo "== bench $name $*" | tee -a "$log"
  timeout -k 10 300 python3 -m spillway bench --sizes full --devices "$devices" --only ${ONLY:-W1,W3,W4} --runs 5 \
    --timeline --label "gc-$name" --out "$files/$name" "$@" >"$files/bench-$name.log" 2>&1
  echo "   rc=$?" | tee -a "$log"
  grep -oE "W[0-9] (spillway|baseline) +(warm-up|run [0-9]+/[0-9]+) [0-9.]+ s|W[0-9] (spillway|baseline) gc pauses.*" \
    "$files/bench-$name.log" | sed "s/^/$name: /" >>"$files/runs.txt"
}
probe freeze spillway
probe dask-cuda dask-cuda
bench freeze
bench no-freeze --no-gc-freeze --no-baseline
probe no-freeze spillway --option gc-freeze=false
python3 - "$files" <<'PY' | tee -a "$log"
import glob, json, os, re, statistics, sys
files = sys.argv[1]
runs = open(os.path.join(files, "runs.txt")).read().splitlines() if os.path.exists(os.path.join(files, "runs.txt")) else []
times = {}
for line in runs:
    m = re.match(r"(\S+): (W\d) (spillway|baseline) +run \d+/\d+ ([0-9.]+) s", line)
    if m:
        times.setdefault((m[2], m[1] if m[3] == "spillway" else "dask-cuda"), []).append(float(m[4]))
print("| workload | side | median s | runs s | longest / median |")
print("| --- | --- | --- | --- | --- |")
for (w, side), ts in sorted(times.items()):
    med = statistics.median(ts)
    print(f"| {w} | {side} | {med:.3f} | {' '.join(f'{t:.2f}' for t in ts)} | {max(ts) / med:.2f} |")
for line in runs:
    if "gc pauses" in line:
        print(line[:400])
print("| probe | start s | first s | runs 2-10 median s | longest s | longest / median |")
print("| --- | --- | --- | --- | --- | --- |")
for name in ("freeze", "no-freeze", "dask-cuda"):
    try:
        r = json.loads([l for l in open(os.path.join(files, f"ten-runs-{name}.json")) if l.startswith("{")][-1])
    except (OSError, IndexError, ValueError):
        print(f"| {name} | failed | | | | |"); continue
    print(f"| {name} | {r['start_s']:.2f} | {r['first_s']:.2f} | {r['later_median_s']:.3f} | {r['later_max_s']:.3f} | "
          f"{r['later_over_median']:.2f} |")
PY
tar -czf "$out/gc-freeze.tar.gz" -C "$files" . && rm -rf "$files"
