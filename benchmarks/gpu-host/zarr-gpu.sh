#!/usr/bin/env bash
# Zarr on one GPU (issue 20), in one call of under 8 minutes on nvidia-h100-x1 (one H100
# 80 GB, 125 GiB RAM, ~60 GB free disk at 1.1 GB/s write, 1.6 GB/s read):
#   1. the GPU tests of Zarr I/O: to_zarr of CuPy-backed dask arrays and xarray Datasets on
#      spillway.local(), --output under a NumPy meta, sharded zstd decoded by nvCOMP to
#      zarr's bits, and the climatology notebook at 8 years (12.1 GB) on one GPU;
#   2. `spillway bench --zarr --sizes small` (12.1 GB: an uncompressed and a sharded zstd
#      store, each written, read cold and cached 3 times, ~2.5 min);
#   3. the full-size bench scaled to what is left of the budget and of the disk: the full
#      store (100 GB) would take 90 s to write and 60 s to read once cold per store, and
#      two of them do not fit the free disk, so the script runs the `full` scale with as
#      many years (of 1.52 GB) as fit (at most 66, the full size), labelled `full-<N>y`;
#      the JSON records its shape and bytes. Skipped when fewer than 10 years fit: after
#      steps 1 and 2 that is likely, so a second call `PARTS=full bash ...` runs step 3 alone
#      with the whole budget (about 17 years, 26 GB, as the disk allows).
# Assumes the test wheels are installed (fetch-test-wheels.sh) and PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks.
#   usage: bash benchmarks/gpu-host/zarr-gpu.sh      (files under $OUT, /tmp/zarr-gpu without it)
#          PARTS=full bash benchmarks/gpu-host/zarr-gpu.sh
# Files (7 or 8): zarr-gpu-tests.log, zarr-bench.log, results/<machine>-<date>-zarr-small.{json,md,png}
# and results/<machine>-<date>-zarr-full-<N>y.{json,md,png}.
set -uo pipefail
out=${OUT:-/tmp/zarr-gpu}
mkdir -p "$out/results"
budget=${BUDGET_S:-450}            # seconds for the whole script, under the 8-minute call
small=${SMALL_SIZE:-small}         # `tiny` to try the script on CPU workers (DASK_SPILLWAY__CPU=true)
parts=" ${PARTS:-tests small full} "
has() { [[ "$parts" == *" $1 "* ]]; }
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
# the stores, the disk ceilings and the workers' spill space: a real disk, not tmpfs
scratch=$(mktemp -d "${SCRATCH:-/tmp}/spillway-zarr-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export DASK_SPILLWAY__DASHBOARD_ADDRESS=127.0.0.1:0

{ echo "scratch $scratch on $(stat -f -c %T "$scratch"):"; df -h "$scratch" | tail -1; nvidia-smi -L; } \
  >"$out/zarr-bench.log" 2>&1
tests_rc=skipped small_rc=skipped small_s=0
if has tests; then
echo "== GPU tests (Zarr I/O and the climatology notebook)" | tee -a "$out/zarr-bench.log"
timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -v -rfEs --timeout 230 --basetemp "$scratch/pytest" \
  tests/workflows/test_zarr_gpu.py tests/workflows/test_zarr_io.py \
  tests/examples/test_notebooks.py::test_climatology_notebook_on_one_gpu >"$out/zarr-gpu-tests.log" 2>&1
tests_rc=$?
echo "pytest exit $tests_rc after $(elapsed) s" | tee -a "$out/zarr-bench.log"
fi

if has small; then
echo "== spillway bench --zarr --sizes $small" | tee -a "$out/zarr-bench.log"
t0=$(date +%s)
timeout 300 python3 -m spillway bench --zarr --sizes "$small" --label "$small" --local-directory "$scratch" \
  --out "$out/results" >>"$out/zarr-bench.log" 2>&1
small_rc=$?
small_s=$(( $(date +%s) - t0 ))
echo "bench small exit $small_rc in $small_s s" | tee -a "$out/zarr-bench.log"
fi

# the full scale, with the years that fit the time left and the disk (both stores at
# once): 60 s of fixed costs (ceilings, cluster) and 10 s a year (write both stores, three
# cold and three cached reads of each at this host's disk rates), or the small run's
# seconds a year where it ran
left=$(( budget - $(elapsed) - 30 ))
free_gb=$(df -P --block-size=1G "$scratch" | awk 'NR==2 {print $4}')
years=$(python3 -c "
left, small_s, free = $left, $small_s, $free_gb
per_year = max(10, (small_s - 60) / 8) if small_s else 10
print(max(0, min(66, int((left - 60) / per_year), int(0.9 * free / 2 / 1.516))))")
full_rc=skipped
if has full && [ "$small_rc" != "skipped" ] && [ "$small_rc" != 0 ]; then
  echo "== full scale skipped: the small run failed (exit $small_rc)" | tee -a "$out/zarr-bench.log"
elif has full && [ "$years" -ge 10 ]; then
  echo "== spillway bench --zarr --sizes full, scaled to $years years ($(python3 -c "print(f'{$years * 1.516:.1f}')") GB; ${left} s and ${free_gb} GB free)" \
    | tee -a "$out/zarr-bench.log"
  timeout $(( left + 20 )) python3 - "$years" "$scratch" "$out/results" >>"$out/zarr-bench.log" 2>&1 <<'PY'
import sys

from spillway_bench.zarr import SCALES
from spillway.cli import main

years, scratch, results = int(sys.argv[1]), sys.argv[2], sys.argv[3]
SCALES["full"] = ((721, 1440), years * 365)  # the full grid, fewer years: see the script's header
main(["bench", "--zarr", "--sizes", "full", "--label", f"full-{years}y", "--local-directory", scratch,
      "--out", results])
PY
  full_rc=$?
elif has full; then
  echo "== full scale skipped: $years years fit in the ${left} s left; run PARTS=full $0 for it" \
    | tee -a "$out/zarr-bench.log"
fi
echo "bench full exit $full_rc; all done in $(elapsed) s" | tee -a "$out/zarr-bench.log"

# the short table, last
python3 - "$out" "$tests_rc" "$small_rc" "$full_rc" <<'PY'
import glob
import json
import re
import sys

out, tests_rc, small_rc, full_rc = sys.argv[1:]
try:
    log = open(f"{out}/zarr-gpu-tests.log", errors="replace").read()
except FileNotFoundError:
    log = ""
counts = re.findall(r"=+ (.*(?:passed|failed|error|skipped).*) in [0-9.]+s", log)
print(f"\ntests: {counts[-1] if counts else 'no summary (exit ' + tests_rc + ')'}")
for line in re.findall(r"^(?:FAILED|ERROR) .*$", log, re.M)[:8]:
    print("  " + line[:160])
nb = re.findall(r"climatology notebook: (\{.*\})", log)
if nb:
    s = json.loads(nb[-1])
    print(f"notebook: {s['store_bytes'] / 1e9:.1f} GB, written in {s['write_s']:.1f} s, climatology "
          f"{s['wall_s']:.1f} s on {s['n_workers']} GPU, rel error {s['rel_error']:.1e}, "
          f"{s['frames_decoded_on_gpus']} frames decoded on the GPU, {s['chunk_io']}")
print(f"bench exits: small {small_rc}, full {full_rc}")
rows = [("run", "store", "write", "cold", "cold/disk", "cached", "decode/GPU", "bits")]
for path in sorted(glob.glob(f"{out}/results/*-zarr-*.json")):
    r = json.load(open(path))
    for store, s in r["stores"].items():
        decode = s.get("decode", {}).get("gpu", {}).get("gbps_per_worker")
        rows.append((f"{r['label']} {r['bytes'] / 1e9:.0f}GB", store, f"{s['write']['gbps']:.2f}",
                     f"{s['cold_read']['gbps']:.2f}", f"{100 * (s['cold_read']['ratio_to_ceiling'] or 0):.0f}%",
                     f"{s['cached_read']['gbps']:.2f}", "—" if decode is None else f"{decode:.2f}",
                     "equal" if all(s[n]["bits_equal"] for n in ("write", "cold_read", "cached_read")) else "DIFFER"))
    c = r["ceilings"]
    met = [t for t in r["targets"] if t["met"]]
    missed = [t for t in r["targets"] if t["met"] is False]
    value = lambda t: "—" if t["value"] is None else (f"{t['value']:.2f} GB/s" if t["unit"] == "GB/s"
                                                       else f"{100 * t['value']:.0f}%")
    print(f"{r['label']}: {r['machine']['name']}; ceilings disk_write {c.get('disk_write', 0):.2f}, disk_read "
          f"{c.get('disk_read', 0):.2f}, h2d_pinned {c.get('h2d_pinned', 0):.1f} GB/s; targets met "
          f"{len(met)} of {len(r['targets'])}" + "".join(f"\n  NOT met: {t['target']}: {value(t)}" for t in missed))
widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
print("GB/s of array bytes (cold/disk: stored bytes against disk_read)")
for row in rows:
    print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
PY
