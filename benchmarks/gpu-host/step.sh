#!/usr/bin/env bash
# Issue 73 on a one-GPU host, one call: the exchange's steps on two workers of the GPU.
#   (tests first, then sizes, then bench)
#   sizes  W3's rechunk and W4's FFT at the sizes of SIZES through the step (over each
#          exchange-transport of TRANSPORTS, default auto), the pieces' tasks and dask's task
#          method, each on its cluster (benchmarks/gpu-host/step_sizes.py)
#   tests  the step's GPU tests (tests/datapath/test_step_gpu.py; TESTS_K: pytest's -k)
#   bench  W1-W5 (small) on two workers of the GPU beside plain dask-cuda
# With the UCXX wheel set: bash .whl/install-wheels.sh .whl && export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
# Writes $OUT/step.log, $OUT/step-sizes-<transport>.json, $OUT/step-tests.log; the bench's files under $OUT/results.
set -u
out=${OUT:-/tmp}
parts=" ${PARTS:-sizes tests bench} "
has() { [[ "$parts" == *" $1 "* ]]; }
log=$out/step.log
(while true; do echo "$(date +%T) $(free -m | awk '/Mem:/{print "used " $3 " avail " $7}')"; sleep 2; done) >"$out/step-free.txt" 2>&1 &
watcher=$!
if has tests; then
  timeout -k 10 ${TESTS_S:-150} python3 -m pytest -m gpu -q -p no:cacheprovider tests/datapath/test_step_gpu.py \
    --timeout 140 -rfEs ${TESTS_K:+-k "$TESTS_K"} >"$out/step-tests.log" 2>&1
  echo "tests rc=$?" | tee -a "$log"
  tail -3 "$out/step-tests.log" | tee -a "$log"
fi
if has sizes; then
  for t in ${TRANSPORTS:-auto}; do
    echo "== step_sizes ${SIZES:-W3:40000,W3:48000,W4:20000,W4:28000} transport $t" | tee -a "$log"
    timeout -k 10 ${SIZES_S:-300} python3 benchmarks/gpu-host/step_sizes.py --sizes "${SIZES:-W3:40000,W3:48000,W4:20000,W4:28000}" \
      --ways "${WAYS:-step,pieces,tasks}" --runs 3 --workers-per-gpu 2 --transport "$t" --out "$out/step-sizes-$t.json" >>"$log" 2>&1
    echo "sizes $t rc=$?" | tee -a "$log"
  done
fi
if has bench; then
  mkdir -p "$out/results"
  timeout -k 10 ${BENCH_S:-200} python3 -m spillway bench --only W1,W2,W3,W4,W5 --sizes small --runs 3 \
    --devices 0 --workers-per-gpu 2 --timeout 120 --label "${BENCH_LABEL:-step}" --out "$out/results" >>"$log" 2>&1
  echo "bench rc=$?" | tee -a "$log"
fi
kill $watcher 2>/dev/null
dmesg 2>/dev/null | grep -i "killed process" | tail -3 | tee -a "$log"
echo; grep -E "last run|^row |^step |^pieces |^tasks " "$log" | cut -c1-300 | tail -40
grep -E "^\| W[1-5]" "$out"/results/*.md 2>/dev/null | head -12
