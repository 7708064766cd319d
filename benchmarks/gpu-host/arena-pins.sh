#!/usr/bin/env bash
# Whether the pinned arena's pins are the stalls (issues 50 and 55), in one call on a freshly
# started nvidia-h100-x2 (GPUs 0,1): the code before pins waited for a quiet worker and the
# code after, each with a fresh cluster, plain dask-cuda beside them once.
#   before: a tree of main before the change, made here and carried:
#     git archive 164b8fa -o .before.tar            (.before.tar in .git/info/exclude)
#   on the host (carry [".whl", ".before.tar"]):
#     bash .whl/install-wheels.sh .whl && export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
#     bash benchmarks/gpu-host/arena-pins.sh
# Per side: spillway bench --sizes full --only W1,W3,W4 --runs 5 --timeline (the "after" side
# with dask-cuda beside it, the "before" side --no-baseline), then the ten-run probe.
# Every run's line says how long arena pins took inside it ("arena pinning X s"; the
# "before" code does not time its pins: its segments show in the timeline's gaps only).
# Under $OUT: arena-pins.tar.gz (logs, bench json/md/png, probe json). Short table last.
set -uo pipefail
out=${OUT:-/tmp/arena-pins}
mkdir -p "$out/files"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
site=${SITE:-/tmp/site}
after=$PWD
before=/tmp/spillway-before
if [ -f .before.tar ]; then rm -rf "$before" && mkdir -p "$before" && tar -xf .before.tar -C "$before"; fi
log="$out/files/arena-pins.log"
{ nvidia-smi -L; free -g | head -2; } >"$log" 2>&1
run_side() {  # side tree baseline-flag
  local side=$1 tree=$2 flag=$3
  echo "== $side: bench" | tee -a "$log"
  PYTHONPATH="$site:$tree:$tree/benchmarks" timeout -k 10 420 python3 -m spillway bench --sizes full --devices 0,1 \
    --only W1,W3,W4 --runs 5 --timeline $flag --label "arena-$side" --out "$out/files/$side" \
    >"$out/files/bench-$side.log" 2>&1
  echo "   rc=$?" | tee -a "$log"
  grep -oE "W[134] (spillway|baseline) +(warm-up|run [0-9]+/[0-9]+).*" "$out/files/bench-$side.log" \
    | sed "s/^/$side: /; s/  */ /g" >>"$out/files/runs.txt"
  echo "== $side: ten runs" | tee -a "$log"
  PYTHONPATH="$site:$tree:$tree/benchmarks" timeout -k 10 180 python3 "$after/benchmarks/gpu-host/ten_runs.py" --rig spillway \
    >"$out/files/ten-runs-$side.json" 2>>"$log"
  echo "   rc=$?" | tee -a "$log"
}
run_side after "$after" ""
if [ -d "$before" ]; then run_side before "$before" --no-baseline; fi
echo "== dask-cuda: ten runs" | tee -a "$log"
PYTHONPATH="$site:$after:$after/benchmarks" timeout -k 10 180 python3 "$after/benchmarks/gpu-host/ten_runs.py" --rig dask-cuda \
  >"$out/files/ten-runs-dask-cuda.json" 2>>"$log"
tar -czf "$out/arena-pins.tar.gz" -C "$out/files" . && rm -rf "$out/files"
python3 - "$out/arena-pins.tar.gz" <<'PY'
import io, json, sys, tarfile
tar = tarfile.open(sys.argv[1])
def text(name):
    try:
        return tar.extractfile(name).read().decode()
    except (KeyError, AttributeError):
        return ""
print(text("./runs.txt"))
print("| probe | first s | runs 2-10 median s | longest s | arena pin s per run |")
print("| --- | --- | --- | --- | --- |")
for side in ("after", "before", "dask-cuda"):
    line = text(f"./ten-runs-{side}.json").strip().splitlines()
    if not line:
        print(f"| {side} | failed | | | |"); continue
    r = json.loads(line[-1])
    pins = r.get("arena_pin_s")
    print(f"| {side} | {r['first_s']:.2f} | {r['later_median_s']:.3f} | {r['later_max_s']:.3f} | "
          f"{'' if pins is None else ' '.join(f'{p:.2f}' for p in pins)} |")
PY
