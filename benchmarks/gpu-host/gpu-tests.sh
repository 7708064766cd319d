#!/usr/bin/env bash
# `pytest -m gpu` on a one-GPU host, in parts that each fit one 10-minute device call:
#   bash benchmarks/gpu-host/gpu-tests.sh 1|2|3|4
# 1: deploy, notebooks, the cluster core (memory, launch, transfer), runs (local), the CLI; 2: the bench's
# GPU tests but the out-of-core matrix (that is `spillway bench --matrix`) and the Zarr bench;
# 3: workflows and the Zarr bench; 4: a job through the shared service on one GPU (the
# two-GPU service test runs on the multi-GPU hosts).
# Assumes the UCX set, then the test wheels (fetch-test-wheels.sh, BESIDE=.whl), are installed and PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks.
# Writes $OUT/gpu-tests-PART.{log,xml}; prints the failures and the summary last.
set -u
part=${1:?part 1, 2, 3 or 4}
out=${OUT:-/tmp}
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
case $part in
  1) paths=(tests/examples tests/options tests/memory tests/datapath tests/launch tests/test_upstream_contract.py tests/test_upstream_failsafe.py tests/run tests/clusters tests/cli tests/service --ignore=tests/service/api) ;;
  2) paths=(tests/bench --ignore=tests/bench/test_ooc_matrix.py --ignore=tests/bench/test_bench_zarr.py) ;;
  3) paths=(tests/workflows tests/bench/test_bench_zarr.py) ;;
  4) paths=(tests/service/api/test_gpu_service_one.py) ;;
  *) echo "part: 1, 2, 3 or 4, not $part" >&2; exit 2 ;;
esac
# a warm host keeps the previous part's stores (a notebook's 12 GB, the bench's spills)
rm -rf "/tmp/pytest-of-$(id -un)"
timeout -k 10 ${BUDGET:-540} python3 -m pytest -m gpu -v -p no:cacheprovider "${paths[@]}" \
  --continue-on-collection-errors --timeout 300 -rfEs --junitxml="$out/gpu-tests-$part.xml" 2>&1 |
  while IFS= read -r line; do printf '%s %s\n' "$(date +%T)" "$line"; done > "$out/gpu-tests-$part.log"
grep -E ' (PASSED|FAILED|ERROR|SKIPPED)' "$out/gpu-tests-$part.log" | sed -E 's/ +\[ *[0-9]+%\]$//' | cut -c1-160
grep -E '^[0-9:]{8} (E  |FAILED|ERROR)' "$out/gpu-tests-$part.log" | cut -c1-240 | tail -25
tail -1 "$out/gpu-tests-$part.log"
