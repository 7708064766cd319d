#!/usr/bin/env bash
# A GPU worker SIGKILLed in the middle of `spillway run` on the GPU host: the run must say
# "worker ... (GPU 0, pid N) died: killed by SIGKILL (the kernel's OOM killer? see dmesg)"
# within seconds of the kill, and exit 1 (before: Dask restarted the worker and recomputed
# the run from its first task, silently). Assumes PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks. Under 3 minutes.
#   usage: benchmarks/gpu-host/worker-kill.sh [SIZE]      (default 60GB)
set -uo pipefail
out=${OUT:-/tmp/worker-kill}
mkdir -p "$out"
size=${1:-60GB}
python3 -m spillway run transpose-sum --param size="$size" --progress >"$out/run.out" 2>"$out/run.err" &
run=$!
# the worker: the spawned child of the run's process that holds a CUDA context; killed once
# the bar counts 30 tasks done
for _ in $(seq 1 600); do
  done=$(tr '\r' '\n' <"$out/run.err" | grep -oE '\| [0-9]+/[0-9]+ tasks' | tail -1 | grep -oE '[0-9]+' | head -1)
  [ "${done:-0}" -ge 30 ] && break
  sleep 0.2
done
worker=$(pgrep -P "$run" -f spawn_main | head -1)
[ -z "$worker" ] && worker=$(pgrep -f "multiprocessing.spawn" | head -1)
echo "killing worker pid $worker after ${done:-0} tasks" | tee "$out/kill.log"
t0=$(date +%s.%N)
kill -9 "$worker"
until grep -q "spillway: error:" "$out/run.err" 2>/dev/null || ! kill -0 "$run" 2>/dev/null; do sleep 0.05; done
t1=$(date +%s.%N)
wait "$run"; rc=$?
echo "said after $(python3 -c "print(round($t1 - $t0, 2))") s, exit $rc" | tee -a "$out/kill.log"
grep "spillway: error:" "$out/run.err" | tee -a "$out/kill.log"
