#!/usr/bin/env bash
# How long `spillway run` takes to refuse, with the numbers, what one GPU's device + host +
# disk cannot hold, and what the refusal touched: the svd of ROWS x 500 float64 (default
# 1.35x GPU 0's memory), twice (the first on a fresh install compiles every module's .pyc).
# For each: the process's wall time and peak RSS (/usr/bin/time), the seconds from the
# interpreter's start to the exit, whether the process made a CUDA context (NVML's compute
# processes of GPU 0), mapped libcuda or imported CuPy; then the slowest imports.
#   usage: benchmarks/gpu-host/refusal.sh        (ROWS=47500000 for the H200's 1.35x)
# Assumes spillway's wheels are installed and PYTHONPATH=/tmp/site:$PWD. Writes under $OUT:
# refusal-{first,second}.err (the refusal and the probe's line), refusal-imports.txt.
set -uo pipefail
out=${OUT:-/tmp/refusal}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD}
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
rows=${ROWS:-$(python3 -c "print(int(1.35 * $mib * 2**20 / (500 * 8)))")}
probe=$(cat <<'PY'
import atexit, os, runpy, sys, time

start = time.perf_counter()


def said():
    took = time.perf_counter() - start
    maps = open(f"/proc/{os.getpid()}/maps").read()
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        context = "YES" if os.getpid() in pids else "none"
    except Exception as e:  # noqa: BLE001 - the probe's own line must print
        context = f"unknown ({e})"
    print(f"probe: {took:.2f} s from the interpreter's start to exit; CUDA context {context}; "
          f"libcuda mapped {'yes' if 'libcuda.so' in maps else 'no'}; "
          f"cupy imported {'yes' if 'cupy' in sys.modules else 'no'}", file=sys.stderr)


atexit.register(said)
sys.argv = ["spillway", "run", "svd", "--param", f"size={sys.argv[1]}x500", "--verify"]
runpy.run_module("spillway", run_name="__main__")
PY
)
for run in first second; do
  /usr/bin/time -f "time: %e s wall, %M KB peak RSS, exit %x" python3 -c "$probe" "$rows" \
    >/dev/null 2>"$out/refusal-$run.err"
done
python3 -X importtime -c "$probe" "$rows" 2>&1 >/dev/null | grep '^import time:' \
  | sort -t'|' -k2 -n | tail -12 >"$out/refusal-imports.txt"
echo "svd ${rows}x500 float64 ($(python3 -c "print(round($rows * 500 * 8 / 1e9, 1))") GB) on a GPU of $mib MiB"
for run in first second; do
  echo "-- $run"
  grep -E "^(spillway: error|probe:|time:)" "$out/refusal-$run.err"
done
echo "-- slowest imports (cumulative us)"
cat "$out/refusal-imports.txt"
