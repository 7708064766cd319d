#!/usr/bin/env bash
# Issue 44 on one GPU, in one device call (under 9 minutes): user code past device + host +
# disk on `spillway.local()` with the defaults, on a freshly started host, the host's memory
# and the spill disk watched (benchmarks/gpu-host/user-rechunk.py says the steps):
#   a persist of more than the tiers hold, refused in under a second before any task runs;
#   a rechunk of a persisted 107.6 GB array (1.35x the H100) to column panels persisted beside
#   it (2.7x), completed with the right values, refused up front, or stopped at a full disk
#   with one line; the held array checked against its values after each; the spill disk empty
#   once everything is dropped; then a verified workflow on the same cluster; the tracebacks
#   printed while the cluster closes counted.
#   usage: benchmarks/gpu-host/user-rechunk.sh        (N=116000 PANEL=1000 BUDGET=430 LIMIT=530)
# Assumes spillway's wheels are installed and PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks. Writes under $OUT:
#   user-rechunk.log   the steps (also printed), the host's and the disk's lowest free
#   user-rechunk.err   stderr of the run (the cluster's logs), tracebacks after the close counted
#   user-rechunk.json  the steps
#   host.log           watch-host.sh's samples (MemAvailable, per-process RSS), every second
set -uo pipefail
out=${OUT:-/tmp/user-rechunk-out}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
here=$(dirname "$0")
log="$out/user-rechunk.log"
err="$out/user-rechunk.err"
tmp=$(python3 -c 'import tempfile; print(tempfile.gettempdir())')
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader; free -g | head -2
  echo "spill filesystem ($tmp):"; df -B1G "$tmp" | tail -1; } >"$log" 2>&1
bash "$here/watch-host.sh" start "$out/host.log" 1
timeout -k 10 "${LIMIT:-530}" python3 "$here/user-rechunk.py" --n "${N:-116000}" --panel "${PANEL:-1000}" \
  --budget "${BUDGET:-430}" --out "$out" 2>"$err" | tee -a "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "user-rechunk.sh: cut off after ${LIMIT:-530} s; user-rechunk.json holds the steps that finished" | tee -a "$log"
fi
bash "$here/watch-host.sh" stop "$out/host.log" | tee -a "$log"
# tracebacks the processes printed while the cluster closed (the issue's "pages of heartbeat
# tracebacks"), and in all
closing=$(awk '/^user-rechunk: closing/{on=1} on && /Traceback \(most recent call last\)/{n++} END{print n+0}' "$err")
echo "tracebacks on stderr: $closing while closing, $(grep -c 'Traceback (most recent call last)' "$err") in all" | tee -a "$log"
grep -E "spill disk is full|refused before it ran|stopped [0-9]+ computation" "$err" | cut -c1-400 | sort | uniq -c | head -5 | tee -a "$log"
echo "spill directories left under $tmp/dask-scratch-space: $(find "$tmp/dask-scratch-space" -path '*spillway-spill-*' -type f 2>/dev/null | wc -l) files" | tee -a "$log"
df -B1G "$tmp" | tail -1 | tee -a "$log"
echo "exit $rc"
