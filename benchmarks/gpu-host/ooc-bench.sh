#!/usr/bin/env bash
# B2, B4, B5, O3 and O4 against plain dask-cuda on the GPU host, at full size and spillway's
# defaults (no memory flags): B4's operands and B5's array at 1.3x the GPUs' memory; O3's
# and O4's footprint at 1.5x the GPUs' memory (2.5x on one GPU), three sides each on a
# fresh cluster (spillway, tasks_method, baseline).
#   usage: benchmarks/gpu-host/ooc-bench.sh PART      PART: b2, b4, b5, o3, o4, o5 (one
#                                                      device call each) or b2b4 (B2 then B4)
# Each run is compared with the newest committed result of the machine under
# benchmarks/results (PREVIOUS: another file or directory); slower rows are printed last.
# Estimates on one H100 80 GB (NOTES.md, "Out of core first"): b2 about
# 5 min, b4 about 5 min, b5 about 6-8 min; b2b4 about 10 min, over one call's limit on
# one H100 (the script still cuts it at 9.5 min): run b2, b4 and b5 as three calls there.
# Assumes spillway's wheels are installed and PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks. Writes under $OUT
# (5 files): the bench's <machine>-<date>-<part>.{json,md,png,log} and ooc-PART.txt (its
# terminal output); prints the targets, met or not, last.
set -uo pipefail
part=${1:?usage: ooc-bench.sh b2|b4|b5|b2b4}
out=${OUT:-/tmp/ooc-out}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
case "$part" in
  # B2: 4 runs a side, the baseline's about 40 s each on one H100
  b2)   only=B2;    timeout=150 ;;
  # B4: a warm-up and one checked run a side; the baseline may run out of device memory
  b4)   only=B4;    timeout=240 ;;
  # B5: the baseline's P2P failure is bounded by the timeout
  b5)   only=B5;    timeout=200 ;;
  b2b4) only=B2,B4; timeout=200 ;;
  # O3, O4: a first run and three timed runs on each side's own cluster, then the check
  o3)   only=O3;    timeout=240 ;;
  o4)   only=O4;    timeout=240 ;;
  o5)   only=O5;    timeout=240 ;;
  *) echo "ooc-bench.sh: unknown part '$part' (b2, b4, b5, o3, o4, o5 or b2b4)" >&2; exit 2 ;;
esac
# the command's limit: a device call's 600 s less the margin (a longer run, on one H200 at
# 1.3x its memory: LIMIT=900)
limit=${LIMIT:-570}
# SIZES and BENCH_FLAGS only for trying the script on CPU workers (SIZES=tiny BENCH_FLAGS=--cpu)
timeout -k 10 "$limit" python3 -m spillway bench --sizes "${SIZES:-full}" ${BENCH_FLAGS:-} --only "$only" --label "$part" --timeout "$timeout" \
  --out "$out" --previous "${PREVIOUS:-benchmarks/results}" >"$out/ooc-$part.txt" 2>&1
rc=$?
[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "ooc-bench.sh: $part cut off after $limit s" | tee -a "$out/ooc-$part.txt"
grep -E "^([BO][0-9] +(spillway|tasks_method|baseline) +(first run|warm-up|run |result|check|FAILED)|ceiling )" \
  "$out/ooc-$part.txt" | tail -40
echo "exit $rc"
sed -n '/^workload /,$p' "$out/ooc-$part.txt" | grep -vE "^(target |wrote |spillway: |previous result|slower: )"
# the bench's targets, met or not, then the rows slower than in the previous result of this machine
grep -E "^(target |previous result|slower: )" "$out/ooc-$part.txt"
# a call brings back files of at most 16 MiB: a stalled side's repeated error lines (O4's
# check on 2 x H200, 2026-11-28) made the terminal output larger; gzip keeps it whole
for f in "$out/ooc-$part.txt" "$out"/*.log; do
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15000000 ] && gzip -f "$f" && echo "ooc-bench.sh: $f gzipped"
done
