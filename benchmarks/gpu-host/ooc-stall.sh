#!/usr/bin/env bash
# One out-of-core bench row until its client logs "Couldn't gather keys" (the stall O4 hit
# after its third run on 2 x H200, 2026-11-28), then what each process is doing:
# py-spy dumps of the bench process and every worker, the workers' own error lines, the
# disk and host memory as sampled.
#   usage: benchmarks/gpu-host/ooc-stall.sh [ROW]     ROW: O4 (default) or O3
#   env:   PYSPY_WHEELS (a folder with the py-spy wheel, .whl-dbg by default)
# Assumes spillway's wheels are installed and PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks.
# Writes under $OUT (at most 7 files): stall-summary.txt, stall-head.txt, stall-tail.txt
# (the bench's terminal output less the repeated gather lines), pyspy.txt, df.log, host.log.
set -u
row=${1:-O4}
out=${OUT:-/tmp/stall-out}
mkdir -p "$out"
here=$(dirname "$0")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
pip install -q --no-deps --target /tmp/pyspy "${PYSPY_WHEELS:-.whl-dbg}"/py_spy-*.whl 2>/dev/null
spy=$(ls /tmp/pyspy/bin/py-spy 2>/dev/null || command -v py-spy)
(while :; do echo "$(date +%T) $(df -m "${TMPDIR:-/tmp}" | tail -1)"; sleep 5; done) > "$out/df.log" &
dfpid=$!
bash "$here/watch-host.sh" start "$out/host.log" 5
log=/tmp/stall-bench.txt
python3 -m spillway bench --sizes full --only "$row" --label stall --timeout 240 --out /tmp/stall-res \
  --previous benchmarks/results > "$log" 2>&1 &
bench=$!
for _ in $(seq "${WAIT_S:-470}"); do
  sleep 1
  grep -q "Couldn't gather" "$log" && break
  kill -0 "$bench" 2>/dev/null || break
done
sleep 15
{
  echo "== stall seen: $(grep -c "Couldn't gather" "$log") gather failures; bench alive: $(kill -0 $bench 2>/dev/null && echo yes || echo no)"
  for pid in $bench $(pgrep -f "multiprocessing.spawn|spillway.*worker" ); do
    echo "== py-spy dump $pid: $(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | cut -c1-120)"
    timeout 30 "$spy" dump --pid "$pid" 2>&1 | head -300
  done
} > "$out/pyspy.txt" 2>&1
kill -INT "$bench" 2>/dev/null; sleep 5; kill -9 "$bench" 2>/dev/null
pkill -9 -f "multiprocessing.spawn" 2>/dev/null
kill "$dfpid"
bash "$here/watch-host.sh" stop "$out/host.log"; rm -f "$out/host.log.oom0" "$out/host.log.pid"
grep -vE "Couldn't gather|rescheduling" "$log" > /tmp/stall-less.txt
head -c 5000000 /tmp/stall-less.txt > "$out/stall-head.txt"
tail -c 3000000 /tmp/stall-less.txt > "$out/stall-tail.txt"
{
  grep -E "spillway_bench.progress" /tmp/stall-less.txt | grep -v ceiling | cut -c1-260
  echo "== error and warning lines, counted"
  grep -E "(ERROR|WARNING|Error|error)" /tmp/stall-less.txt | sed -E 's/^[0-9-]+ [0-9:,]+ //; s/0x[0-9a-f]+/0x./g; s/[0-9]+/N/g' |
    cut -c1-220 | sort | uniq -c | sort -rn | head -40
  echo "== disk, last samples"; tail -3 "$out/df.log"
  dmesg 2>/dev/null | grep -iE "killed process|out of memory" | tail -3
} > "$out/stall-summary.txt"
cat "$out/stall-summary.txt"
grep -E "^== py-spy|^Thread|get_data|__getitem__|_restore|wait|lock" "$out/pyspy.txt" | head -60
