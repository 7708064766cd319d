#!/usr/bin/env bash
# One slice of the out-of-core matrix on the GPU host, in one device call (under 10 minutes):
# every case of the slice at 1.3x the GPUs' memory, checked against NumPy float64 from the
# seeds, with the copy ceilings measured first and each case's copy bound next to its time.
#   usage: benchmarks/gpu-host/matrix-slices.sh SLICE        (1 ... 12, in that order, or case ids
#          separated by commas: cli-fft,user-code-qr; 11 and 12, the service and batch paths,
#          need the service wheel set .whl-svc installed; `python -m spillway_bench.matrix.slices
#          480` packs the cases into slices of another length)
# Every case's row has the peak host memory in use and the lowest MemAvailable (sampled every
# 0.5 s), flagged under the store's headroom, and the kernel's OOM kills during the case.
# Slices and their estimates on one H100 80 GB: `spillway bench --matrix` in NOTES.md
# ("The out-of-core matrix"). Assumes spillway's wheels are installed and
# PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks. Writes under $OUT (5 files, no folders):
#   <machine>-<date>-ooc-matrix.{json,md,png}  the slice's rows (rewritten after every case)
#   matrix-SLICE.log                           progress, ceilings, one line per case
#   matrix-SLICE.txt                           the short table, also printed last
# Back here: spillway bench --matrix-merge <fetched folder> --out benchmarks/results
set -uo pipefail
slice=${1:?usage: matrix-slices.sh SLICE (1 ... 12, or case ids separated by commas)}
out=${OUT:-/tmp/matrix-out}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
# no case starts after BUDGET seconds; a case that starts just before it has the rest of
# the call (estimates: NOTES.md); the timeout keeps the files written so far
budget=${BUDGET:-420}
# the whole slice's limit: a device call's 600 s, less the margin; a step of queue.sh, which
# runs on between calls, may set a longer one (LIMIT=3000 BUDGET=2800)
limit=${LIMIT:-575}
name=$(echo "$slice" | tr ',' '+' | cut -c1-60)
log="$out/matrix-$name.log"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader; free -g | head -2; } >"$log" 2>&1
# MATRIX_FLAGS only for trying the script on CPU workers (MATRIX_FLAGS="--cpu --n-workers 2")
timeout -k 10 "$limit" python3 -m spillway bench --matrix "$slice" ${MATRIX_FLAGS:-} --budget "$budget" --timeout 400 --out "$out" \
  >"$out/matrix-$name.txt" 2>>"$log"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "matrix-slices.sh: slice $slice cut off after $limit s; the table holds the cases that finished" | tee -a "$log"
  dmesg 2>/dev/null | grep -iE "out of memory|killed process" | tail -3 >>"$log"
fi
grep -E "^(matrix |ceiling |[a-z_-]+ +(ok|refused|FAILED) )" "$log" | tail -20
echo "exit $rc"
# grep -c exits 1 on no match, so readability is dmesg's own exit status
if kernel=$(dmesg 2>/dev/null); then
  echo "kernel OOM lines (all of the log): $(printf '%s\n' "$kernel" | grep -ciE 'out of memory|killed process')"
else
  echo "kernel OOM lines: unreadable (dmesg failed)"
fi
cat "$out/matrix-$name.txt"
