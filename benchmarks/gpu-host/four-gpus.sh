#!/usr/bin/env bash
# Four GPUs (issue 51) on nvidia-h100-x4, defaults, plain dask-cuda 26.10 in the same call.
# Parts, in the order given by PARTS (each skipped with a line when the budget cannot hold it):
#   probe     the ten-run probe on a fresh cluster of all four, spillway then dask-cuda, the
#             worker logs searched for "Worker stream died" and endpoint timeouts      ~2 min
#   bench     spillway bench --sizes full --devices 0,1,2,3 --timeline (W1-W5, dask-cuda
#             beside it, ceilings, bounds)                                              ~5 min
#   rechunk4  spillway run rechunk 223607x223607 chunks=1000 on 0,1,2,3 --verify (400 GB),
#             the host watched                                                          ~1.5 min
#   rechunk2  the 200 GB one (158113x158113) on 0,1                                     ~1 min
#   fft       spillway run fft at FFT_SIZE (1.5x the four GPUs) --verify, host watched
#   tests     pytest -m gpu of the multi-GPU tests (TESTS overrides)                    ~3 min
# Start the call's command with the freshly started host's parts (probe first): a part
# that runs after another measures a warm host.
#   bash .whl/install-wheels.sh .whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
#   PARTS="probe bench rechunk4" bash benchmarks/gpu-host/four-gpus.sh
# Under $OUT: four-gpus.tar.gz (every log, json, md, png) and four-gpus.log; table last.
set -uo pipefail
out=${OUT:-/tmp/four-gpus}
files="$out/files"
mkdir -p "$files"
scratch=$(mktemp -d "${SCRATCH:-/tmp}/four-gpus-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
budget=${BUDGET_S:-540}
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
log="$out/four-gpus.log"
fits() { if [ "$(left)" -ge "$1" ]; then return 0; fi
         echo "== $2 skipped: $(left) s left of the budget, it needs about $1 s" | tee -a "$log"
         return 1; }
{ date -u +%FT%TZ; nvidia-smi -L; nvidia-smi topo -m | head -6; free -g | head -2; df -h /tmp | tail -1
  git log --oneline -1 2>/dev/null || true; } >"$log" 2>&1
cat "$log"
rcs=""
for part in ${PARTS:-probe bench rechunk4}; do
  case $part in
    probe)
      fits 150 probe || continue
      for rig in spillway dask-cuda; do
        echo "== probe $rig (0,1,2,3)" | tee -a "$log"
        timeout -k 10 150 python3 benchmarks/gpu-host/ten_runs.py --rig $rig --devices 0,1,2,3 \
          >"$files/ten-runs-$rig.json" 2>"$files/ten-runs-$rig.log"
        rcs="$rcs probe-$rig:$?"
        echo "   stream died / endpoint timeouts in its worker logs:" \
          "$(grep -c -i -E 'Worker stream died|endpoint timeout|UCXXEndpointTimeout' "$files/ten-runs-$rig.log")" | tee -a "$log"
      done ;;
    bench)
      fits 240 bench || continue
      echo "== spillway bench --sizes full --devices 0,1,2,3 --timeline ${BENCH_FLAGS:-}" | tee -a "$log"
      # shellcheck disable=SC2086
      timeout -k 10 $(( $(left) - 20 )) python3 -m spillway bench --sizes full --devices 0,1,2,3 --timeline \
        --label four-gpus --out "$files/bench" ${BENCH_FLAGS:-} >"$files/bench.log" 2>&1
      rcs="$rcs bench:$?" ;;
    rechunk4|rechunk2)
      if [ $part = rechunk4 ]; then size=223607x223607 devices=0,1,2,3 need=100; else size=158113x158113 devices=0,1 need=80; fi
      fits $need $part || continue
      echo "== spillway run rechunk $size chunks=1000 --devices $devices --verify" | tee -a "$log"
      bash benchmarks/gpu-host/watch-host.sh start "$files/host-$part.log" 2
      timeout -k 10 $(( $(left) - 10 )) python3 -m spillway run rechunk --param size=$size --param chunks=1000 \
        --devices $devices --local-directory "$scratch" --verify --json --no-progress \
        >"$files/$part.json" 2>"$files/$part.log"
      rcs="$rcs $part:$?"
      bash benchmarks/gpu-host/watch-host.sh stop "$files/host-$part.log" | tee -a "$log" ;;
    fft)
      fits 200 fft || continue
      echo "== spillway run fft ${FFT_SIZE:-480GB} --devices 0,1,2,3 --verify" | tee -a "$log"
      bash benchmarks/gpu-host/watch-host.sh start "$files/host-fft.log" 2
      timeout -k 10 $(( $(left) - 10 )) python3 -m spillway run fft --param size=${FFT_SIZE:-480GB} \
        --devices 0,1,2,3 --local-directory "$scratch" --verify --json --no-progress \
        >"$files/fft.json" 2>"$files/fft.log"
      rcs="$rcs fft:$?"
      bash benchmarks/gpu-host/watch-host.sh stop "$files/host-fft.log" | tee -a "$log" ;;
    tests)
      fits 120 tests || continue
      echo "== pytest -m gpu (multi-GPU)" | tee -a "$log"
      # shellcheck disable=SC2086
      timeout -k 10 $(( $(left) - 10 )) python3 -m pytest -m gpu -v -p no:cacheprovider --timeout 240 -rfEs \
        ${TESTS:-tests/datapath/test_collective_gpu.py tests/datapath/test_collective_copies.py tests/datapath/test_dataplane_gpu.py tests/memory} \
        >"$files/tests.log" 2>&1
      rcs="$rcs tests:$?"
      grep -E "(FAILED|ERROR)" "$files/tests.log" | cut -c1-200 | head -20 | tee -a "$log"
      tail -1 "$files/tests.log" | tee -a "$log" ;;
    *) echo "== unknown part $part" | tee -a "$log" ;;
  esac
done
echo "== exit codes:$rcs; $(( $(date +%s) - start )) s" | tee -a "$log"
python3 - "$files" <<'PY' | tee -a "$log"
import json, os, sys
files = sys.argv[1]
for name in ("ten-runs-spillway", "ten-runs-dask-cuda", "rechunk4", "rechunk2", "fft"):
    try:
        r = json.loads([l for l in open(os.path.join(files, f"{name}.json")) if l.startswith("{")][-1])
    except (OSError, IndexError, ValueError):
        continue
    if name.startswith("ten-runs"):
        print(f"{name} (4 GPUs): start {r['start_s']:.2f} s, first {r['first_s']:.2f} s, runs 2-10 median "
              f"{r['later_median_s']:.3f} s, longest {r['later_max_s']:.3f} s, arena pins {r.get('arena_pin_s')}")
    else:
        print(f"{name}: wall {r.get('wall_s')} s, verify {r.get('verify')}, spilled {r.get('bytes_spilled')}")
PY
grep -h -E "^(\| W|\| workload)" "$files"/bench/*.md 2>/dev/null | head -20
tar -czf "$out/four-gpus.tar.gz" -C "$files" . && rm -rf "$files"
