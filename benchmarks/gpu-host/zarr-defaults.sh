#!/usr/bin/env bash
# Zarr as people store it (issue 29), one call of under 9 minutes on nvidia-h100-x1.
# The wheels (here, once; zstandard for decoding while reading, issue 29's streamed path):
#   NO_UCX=1 EXTRA="nvidia-nvcomp-cu13==6.0.0.12 nvidia-libnvcomp-cu13==6.0.0.12 zstandard==0.25.0" \
#     bash ../shared/gpu-host/fetch-wheels.sh .whl-zarr
# On the host:
#   bash .whl-zarr/install-wheels.sh .whl-zarr && export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
#   bash benchmarks/gpu-host/zarr-defaults.sh            (PARTS="tests nvcomp bench" by default)
#   PARTS=rates bash benchmarks/gpu-host/zarr-defaults.sh   (a second call: per-thread decode rates)
# 0. always: which path chunks take (zstandard installed: decoded while read, in pieces);
# 1. tests: the Zarr GPU tests in one pytest process (the nvCOMP batch decode among them,
#    in the suite's own process: the codec-lifetime crash is fixed) and the CPU Zarr I/O tests;
# 2. nvcomp: the nvCOMP test alone, 3 times (it crashed alone 3 of 3 before the fix);
# 3. bench: `python -m spillway_bench.zarr.defaults --years 8`: the default stores
#    (xarray to_zarr / zarr create_array, zstd, one frame per 1.5 GB chunk), smooth field +
#    noise and random, read into the GPU by cluster.open cached and cold, beside plain
#    dask-cuda (xr.open_zarr + map_blocks(cupy.asarray), 3 chunks) in the same run, and the
#    monthly climatology by each on the field store, checked against NumPy float64.
# 4. rates: `python -m spillway_bench.zarr.decode_rates --days 365`: one 1.5 GB chunk decoded
#    on one thread, numcodecs whole against streamed in 4-64 MiB pieces, cached, and cold
#    (the file dropped from the page cache) read whole + decoded against streamed (about 4 minutes).
# Files under $OUT (/tmp/zarr-defaults without it): zarr-tests.log, nvcomp-alone.log,
# zarr-defaults.log, zarr-defaults.json, decode-rates.{log,json}. The short table is printed last. BUDGET_S (450) bounds
# the script after the install; a dry run on CPU here: PARTS=bench YEARS=2 BENCH_ARGS="--cpu --grid 37x72".
set -uo pipefail
out=${OUT:-/tmp/zarr-defaults}
mkdir -p "$out"
parts=" ${PARTS:-tests nvcomp bench} "
has() { [[ "$parts" == *" $1 "* ]]; }
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
scratch=$(mktemp -d "${SCRATCH:-/tmp}/spillway-zd-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export DASK_SPILLWAY__DASHBOARD_ADDRESS=127.0.0.1:0
summary=()
{ nvidia-smi -L; nproc; free -g | head -2; df -h "$scratch" | tail -1; } > "$out/machine.txt" 2>&1
summary+=("$(python3 -c 'from spillway.workflows.zarr.stream_decode import piece_bytes
try:
    import zstandard
    print(f"zstandard {zstandard.__version__}: default-store chunks decoded while read, in {piece_bytes() >> 20} MiB pieces")
except ImportError:
    print("zstandard NOT installed: whole-chunk numcodecs path (fetch .whl-zarr with zstandard in EXTRA)")' 2>&1 | tail -1)")

if has tests; then
  timeout 230 python3 -m pytest -m gpu -p no:cacheprovider -v -rfEs --timeout 200 \
    --basetemp "$scratch/pytest" tests/workflows/test_zarr_gpu.py tests/workflows/test_zarr_io.py \
    > "$out/zarr-tests.log" 2>&1
  summary+=("tests: exit $? ($(tail -1 "$out/zarr-tests.log")) after $(elapsed) s")
fi
if has nvcomp; then
  : > "$out/nvcomp-alone.log"
  codes=""
  for i in 1 2 3; do
    timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/workflows/test_zarr_gpu.py::test_nvcomp_batch_decode_equals_numcodecs >> "$out/nvcomp-alone.log" 2>&1
    codes+=" $?"
  done
  summary+=("nvCOMP test alone, 3 runs, exit codes:$codes (0 passed; 139 SIGSEGV) after $(elapsed) s")
fi
if has bench; then
  left=$(( ${BUDGET_S:-450} - $(elapsed) ))
  timeout $(( left > 60 ? left : 60 )) python3 -m spillway_bench.zarr.defaults --years "${YEARS:-8}" \
    --baseline-years "${BASELINE_YEARS:-3}" --directory "$scratch" --out "$out" ${BENCH_ARGS:-} > "$out/zarr-defaults.log" 2>&1
  rc=$?
  summary+=("bench: exit $rc after $(elapsed) s (log zarr-defaults.log)")
fi
if has rates; then
  timeout 400 python3 -m spillway_bench.zarr.decode_rates --days "${RATE_DAYS:-365}" --runs "${RATE_RUNS:-2}" --cold \
    --directory "$scratch" --out "$out/decode-rates.json" > "$out/decode-rates.log" 2>&1
  summary+=("decode rates: exit $? after $(elapsed) s (log decode-rates.log)")
fi
grep -E "^(FAILED|ERROR)" "$out/zarr-tests.log" 2>/dev/null | cut -c1-200
printf '%s\n' "${summary[@]}"
if has rates; then
  sed -n '/^zstd decode of one/,$p' "$out/decode-rates.log"
fi
if has bench; then
  # the table is the bench's last lines
  sed -n '/^Zarr default stores/,$p' "$out/zarr-defaults.log"
  [ "${rc:-1}" = 0 ] || tail -15 "$out/zarr-defaults.log"
fi
