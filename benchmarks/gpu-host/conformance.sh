#!/usr/bin/env bash
# dask's own CuPy array tests (shipped in the dask wheel) on spillway's cluster with
# forced spilling through host memory and through disk, and on plain dask-cuda with the
# same device limit as the control, one after the other in one call.
#   usage: benchmarks/gpu-host/conformance.sh [SECONDS_PER_RUN] [LOGDIR]
set -uo pipefail
limit=${1:-300}
logs=${2:-${OUT:-/tmp}}
here=$(cd "$(dirname "$0")/../.." && pwd)
modules=${MODULES:-$(python3 - <<'PY'
import pkgutil, dask.array.tests as t
print(" ".join(f"dask.array.tests.{m.name}" for m in pkgutil.iter_modules(t.__path__) if m.name.startswith("test_cupy_")))
PY
)}
export PYTHONPATH="$here/tests/conformance:${PYTHONPATH:-}"
for kind in ${KINDS:-tiered-host tiered-disk dask-cuda}; do
  echo "== $kind"
  timeout "$limit" python3 -m pytest -p dask_cupy_conformance --conformance="$kind" -p no:cacheprovider \
    -v -rfE --timeout ${PER_TEST:-60} -o addopts= ${CONFORMANCE_ARGS:-} --pyargs $modules >"$logs/conformance-$kind.log" 2>&1
  echo "exit $?"
  grep -E "^(FAILED|ERROR)|(passed|failed|error)|Timeout" "$logs/conformance-$kind.log" | tail -30
done
