#!/usr/bin/env bash
# How long `spillway run` takes to refuse, with the numbers, what one GPU's device + host +
# disk cannot hold, and what the refusal touched: the svd of ROWS x 500 float64, twice (the
# first on a fresh install compiles every module's .pyc). The default ROWS make the input
# 0.9x the capacity spillway plans for this machine (device + host tier + disk), so the
# parameters' bytes pass and the refusal is the projected footprint's (said from the svd's
# parameters: no graph is built).
# The GPU hosts set PYTHONDONTWRITEBYTECODE=1 and install-wheels.sh installs --no-compile,
# so every run there compiles every module (0.1-0.9 s); COMPILE=1 first writes the .pyc
# files a user's pip install leaves (python -m compileall of /tmp/site and spillway/).
# For each: the process's wall time and peak RSS (/usr/bin/time), the seconds from the
# interpreter's start to the exit, whether the process made a CUDA context (NVML's compute
# processes of GPU 0), mapped libcuda or imported CuPy; then the slowest imports.
#   usage: benchmarks/gpu-host/refusal.sh        (or ROWS=N)
# Assumes spillway's wheels are installed and PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks. Writes under $OUT:
# refusal-{first,second}.err (the refusal and the probe's line), refusal-imports.txt.
set -uo pipefail
out=${OUT:-/tmp/refusal}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
capacity() {
  python3 - <<'PY'
from spillway.service import preflight
from spillway.options.gpus import discover
from spillway.launch import HostProbe, plan, worker_specs
from spillway.memory.growth import host_total
from spillway.options.settings import Options

options = Options.resolve()
launch = plan(options, discover(), HostProbe.here())
_, capacity = preflight.planned(worker_specs(options, launch), launch.device_memory, options.local_directory,
                                host_total())
print(int(0.9 * capacity.total_bytes / (500 * 8)))
PY
}
[ -n "${COMPILE:-}" ] && python3 -m compileall -q -j 8 /tmp/site spillway >/dev/null 2>&1
rows=${ROWS:-$(capacity)}
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
