#!/usr/bin/env bash
# A run past the GPU with the host watched from outside (the kernel's figures, not the
# store's books), then the GPU tests of the memory package:
#   bash benchmarks/gpu-host/host-memory.sh [WORKFLOW K=V ...]   (default: svd size=27000000x500)
# Writes $OUT/books.log (the store's books beside each worker's RssAnon/RssShmem, every 3 s),
# $OUT/host.log (free memory and every python process, every 2 s), $OUT/memory-tests.log;
# prints the lowest MemAvailable, OOM kills, the run's result and the tests' summary last.
set -u
out=${OUT:-/tmp}
here=$(dirname "$0")
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
[ $# -gt 0 ] || set -- svd size=27000000x500
bash "$here/watch-host.sh" start "$out/host.log" 2
timeout -k 5 ${RUN_BUDGET:-300} python3 "$here/host-books.py" "$@" --every 3 > "$out/books.log" 2>&1
echo "run $*: exit $?"
bash "$here/watch-host.sh" stop "$out/host.log"
grep -E "^(wall|ERROR|verify)" "$out/books.log" | cut -c1-400
grep -E "paused|resumed|short of memory" "$out/books.log" | head -5 | cut -c1-300
if [ -n "${TESTS:-}" ]; then
  timeout -k 5 ${TEST_BUDGET:-200} python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 180 $TESTS \
    > "$out/memory-tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/memory-tests.log" | tail -8
fi
