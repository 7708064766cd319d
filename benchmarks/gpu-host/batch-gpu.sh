#!/usr/bin/env bash
# The rendered one-node Slurm batch script, run on the GPU host (which has no Slurm) with
# spillway's srun stand-in (spillway/deploy/slurm/srun) first on PATH: the script starts
# its scheduler, the worker command with the flags it renders from the defaults, and the
# workflow step, as in a one-node allocation; the workflow's report must say verified.
#   usage: benchmarks/gpu-host/batch-gpu.sh [WORKFLOW] [FACTOR]
#     WORKFLOW  rechunk (default), matmul, svd, ... (any catalogue workflow)
#     FACTOR    projected footprint as a multiple of the GPUs' memory (default 1.35)
#   CPU=1 batch-gpu.sh    the same on 2 CPU workers at FACTOR x a 48 MiB stand-in (a test
#                         anywhere; the script for CPU workers is rendered instead)
# Assumes spillway's wheels are installed (bash .whl-svc/install-wheels.sh .whl-svc) and
# PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks. Writes under $OUT: batch-WORKFLOW/ (the script, the job's
# output file, spillway-JOBID/ with scheduler, worker and workflow logs and the report).
# Prints a short table last; exit status 0 only when the result was verified.
set -uo pipefail
workflow=${1:-rechunk}
factor=${2:-1.35}
out=${OUT:-/tmp/batch-out}
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
dir="$out/batch-$workflow"
rm -rf "$dir" && mkdir -p "$dir" || exit 1
job_id=$((4000 + RANDOM % 1000))

# the size: the workflow's projected footprint at FACTOR x the GPUs' memory (NVML), on the
# target `spillway run` sees there (one worker per GPU, default device limit)
if [ "${CPU:-0}" = 1 ]; then
  cluster=(--cpu --n-workers 2); gpus=0
  scale="cpu_scale(factor=$factor)"
else
  cluster=(); gpus=$(nvidia-smi -L | wc -l)
  scale="gpu_scale($factor)"
fi
params=$(python3 - <<PY
from spillway_bench.matrix import Case, workflow_params, cpu_scale, gpu_scale
params, footprint = workflow_params(Case("$workflow", "batch"), $scale)
print(" ".join(f"--param {k}={v}" for k, v in params.items()), footprint)
PY
) || { echo "batch-gpu.sh: cannot size $workflow" >&2; exit 1; }
footprint=${params##* }
params=${params% *}

# defaults: nothing but the job's shape; --time leaves the device call's margin
python3 -m spillway slurm render "$workflow" $params --nodes 1 --gpus-per-node "$gpus" --time 00:09:00 \
  --output-dir "$dir" --start-timeout 240 "${cluster[@]}" >"$dir/job.sbatch" 2>"$dir/render.log" \
  || { cat "$dir/render.log"; exit 1; }
mkdir -p "$dir/bin"
cp spillway/deploy/slurm/srun "$dir/bin/srun" && chmod +x "$dir/bin/srun"
free -m | sed -n 2p | awk '{print "host memory before: used " $3 " MiB, available " $7 " MiB"}' >"$dir/memory.txt"
t0=$SECONDS
# what sbatch would do: the job's id and output file; the stand-in first on PATH
PATH="$dir/bin:$PATH" SLURM_JOB_ID=$job_id SLURM_JOB_NUM_NODES=1 SLURM_SUBMIT_DIR="$dir" \
  timeout -k 30 520 bash "$dir/job.sbatch" >"$dir/spillway-$job_id.out" 2>&1
rc=$?
elapsed=$((SECONDS - t0))
results="$dir/spillway-$job_id"
report=$(ls "$results"/01-*.json 2>/dev/null | head -1)
tail -3 "$dir/spillway-$job_id.out"
[ "$rc" = 0 ] || { echo "batch-gpu.sh: the script exited $rc"; tail -5 "$results"/01-*.log 2>/dev/null; }
dmesg 2>/dev/null | grep -i "killed process" | tail -3 | sed 's/^/oom: /'
python3 - "$report" "$workflow" "$footprint" "$rc" "$elapsed" <<'PY'
import json, sys
from spillway.options.sizes import format_bytes
path, workflow, footprint, rc, script_s = sys.argv[1:]
try:
    r = json.loads(open(path).read().strip().splitlines()[-1])
except Exception as e:  # no report: the step failed before writing it
    print(f"| {workflow} | {format_bytes(int(footprint))} | — | — | no report ({type(e).__name__}) | exit {rc} |")
    sys.exit(1)
v = r.get("verify") or {}
peak = max((p for p in r["peak_bytes_per_worker"].values() if p), default=0)
host = max((p for p in (r.get("peak_host_bytes_per_worker") or {}).values() if p), default=0)
moved = ", ".join(f"{k} {format_bytes(b)}" for k, b in (r.get("spilled_by_tier") or {}).items() if b) or "none"
print("| workflow | footprint | wall s | script s | verified (rel error) | peak device / host | moved | transport |")
print("| --- | ---: | ---: | ---: | --- | ---: | --- | --- |")
print(f"| {workflow} | {format_bytes(r['footprint']['total_bytes'])} | {r['wall_s']:.1f} | {float(script_s):.0f} "
      f"| {v.get('ok')} ({v.get('rel_error') or 0:.1e}) | {format_bytes(peak)} ({r['memory_measure']}) / "
      f"{format_bytes(host)} | {moved} | {r.get('transport') or r['cluster']['protocol']} |")
sys.exit(0 if v.get("ok") and rc == "0" else 1)
PY
