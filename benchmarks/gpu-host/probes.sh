#!/usr/bin/env bash
# The ten-run probe (issue 55) in several variants, each a fresh cluster on GPUs 0,1, in the
# order given (the first on the freshly started host), plain dask-cuda among them:
#   VARIANTS="default pinned0:pinned-pool-size=0 noplane:data-plane=false default dask-cuda"
#   bash benchmarks/gpu-host/probes.sh
# A variant is NAME or NAME:KEY=VALUE[,KEY=VALUE] (spillway.local options; an upper-case KEY
# is an environment variable of that probe's process, UCX_PROTO_INFO=y for one); "dask-cuda"
# is the baseline. Each probe's JSON has its runs and each run's anatomy (the bench's timeline
# of it: first task, tail after the last task, each worker's compute, transfer, idle). Then, with
# BENCH=1, spillway bench --sizes full on both GPUs (W1-W5, dask-cuda beside it).
# Under $OUT: probes.tar.gz; the table last.
set -uo pipefail
out=${OUT:-/tmp/probes}
files="$out/files"
mkdir -p "$files"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
devices=${DEVICES:-0,1}
log="$files/probes.log"
{ date -u +%FT%TZ; nvidia-smi -L; free -g | head -2; git log --oneline -1 2>/dev/null; } >"$log" 2>&1
i=0
for variant in ${VARIANTS:-default dask-cuda}; do
  i=$((i + 1))
  name=${variant%%:*}
  args=(--rig spillway)
  [ "$name" = dask-cuda ] && args=(--rig dask-cuda)
  envs=()
  if [[ "$variant" == *:* ]]; then
    IFS=, read -ra opts <<<"${variant#*:}"
    for o in "${opts[@]}"; do
      if [[ "${o%%=*}" =~ ^[A-Z_]+$ ]]; then envs+=("$o"); else args+=(--option "$o"); fi
    done
  fi
  echo "== probe $i $name ${args[*]} ${envs[*]}" | tee -a "$log"
  env "${envs[@]}" timeout -k 10 150 python3 benchmarks/gpu-host/ten_runs.py --devices "$devices" "${args[@]}" \
    >"$files/probe-$i-$name.json" 2>"$files/probe-$i-$name.log"
  echo "   rc=$?" | tee -a "$log"
done
if [ "${BENCH:-0}" = 1 ]; then
  echo "== bench --sizes full --devices $devices" | tee -a "$log"
  timeout -k 10 ${BENCH_S:-330} python3 -m spillway bench --sizes full --devices "$devices" --timeline \
    --label probes --out "$files/bench" >"$files/bench.log" 2>&1
  echo "   rc=$?" | tee -a "$log"
fi
python3 - "$files" <<'PY' | tee -a "$log"
import glob, json, os, sys
files = sys.argv[1]
print("| # | variant | start s | first s | runs 2-10 median s | longest s | runs s |")
print("| --- | --- | --- | --- | --- | --- | --- |")
slow = []
for path in sorted(glob.glob(os.path.join(files, "probe-*.json")), key=lambda p: int(p.split("probe-")[1].split("-")[0])):
    name = os.path.basename(path)[6:-5]
    try:
        r = json.loads([l for l in open(path) if l.startswith("{")][-1])
    except (IndexError, ValueError):
        print(f"| {name} | failed | | | | | |"); continue
    print(f"| {name} | {' '.join(r.get('options') or [])} | {r['start_s']:.2f} | {r['first_s']:.2f} | "
          f"{r['later_median_s']:.3f} | {r['later_max_s']:.3f} | {' '.join(f'{t:.2f}' for t in r['runs_s'])} |")
    if r.get("start_steps"):
        slow.append(f"{name} start: " + ", ".join(f"{k} {v:.1f}" for k, v in r["start_steps"].items()))
    for k, (t, a) in enumerate(zip(r["runs_s"], r.get("anatomy") or [])):
        if k == 0 or t > 1.5 * r["later_median_s"]:
            slow.append(f"{name} run {k + 1} {t:.3f} s: {a}")
print("\n".join(slow))
for md in glob.glob(os.path.join(files, "bench", "*.md")):
    print("\n".join(l for l in open(md).read().splitlines() if l.startswith("| W")))
PY
tar -czf "$out/probes.tar.gz" -C "$files" . && rm -rf "$files"
