#!/usr/bin/env bash
# The data plane between two GPUs (issue 43) on nvidia-h100-x2, one worker per GPU, in one
# call (PARTS splits it; a part that would not finish in the budget is skipped with a line):
#   moves    one CuPy chunk GPU0 -> GPU1 at each size (a warm-up, REPEATS timed, the time from
#            the receiver's incoming transfer log, the bits compared): spillway with the data
#            plane, spillway with --no-data-plane, plain dask-cuda 26.10 (two `dask cuda
#            worker`, protocol ucx); the peer copy and UCXX ceilings measured first     ~2.5 min
#   bench    spillway bench --sizes full on both GPUs (W1-W5, plain dask-cuda beside it, the
#            ceilings and each workload's bounds), with each worker's timeline          ~4 min
#   rechunk  spillway run rechunk --param size=158113x158113 --param chunks=1000 --devices 0,1
#            --verify (200 GB, 1.25x the two GPUs), the host watched                     ~1.5 min
#   tests    pytest -m gpu of the data plane and the transfer tests (TESTS: other files) ~2 min
# With the UCXX wheel set (/work/shared/gpu-host/fetch-wheels.sh .whl; carry .whl):
#   bash .whl/install-wheels.sh .whl && export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
#   bash benchmarks/gpu-host/two-gpus.sh              # moves bench rechunk, budget 540 s
#   PARTS="tests rechunk" bash benchmarks/gpu-host/two-gpus.sh
# Files under $OUT: two-gpus.log (all output), moves-*.json, rechunk.json, host.log,
# tests.log, results.tar.gz (the bench's json/md/png). The short table is printed last.
set -uo pipefail
out=${OUT:-/tmp/two-gpus}
mkdir -p "$out"
results=$(mktemp -d "${SCRATCH:-/tmp}/two-gpus-XXXXXX")
scratch=$(mktemp -d "${SCRATCH:-/tmp}/two-gpus-scratch-XXXXXX")
trap 'rm -rf "$scratch" "$results"' EXIT
mkdir -p "$results/results"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
budget=${BUDGET_S:-540}
parts=" ${PARTS:-moves bench rechunk} "
sizes=${SIZES:-16MiB,256MiB,1GiB,4GiB}
repeats=${REPEATS:-5}
has() { [[ "$parts" == *" $1 "* ]]; }
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
log="$out/two-gpus.log"
fits() { if [ "$(left)" -ge "$1" ]; then return 0; fi
         echo "== $2 skipped: $(left) s left of the budget, it needs about $1 s; run it with PARTS=$2" | tee -a "$log"
         return 1; }
{ nvidia-smi -L; nvidia-smi topo -m | head -4; free -g | head -2; df -h /tmp | tail -1
  python3 -c "import distributed, dask_cuda, ucxx; print('distributed', distributed.__version__, 'dask-cuda', dask_cuda.__version__, 'ucxx', ucxx.__version__)"
  python3 -m spillway info 2>&1 | grep -E "^transport|^GPU|NVLink" || true; } >"$log" 2>&1
cat "$log"
rc_moves=skipped rc_bench=skipped rc_rechunk=skipped rc_tests=skipped

if has moves && fits 150 moves; then
  for rig in ${RIGS:-plane comm dask-cuda}; do
    envs=()
    case $rig in
      plane) args=(--rig spillway --ceiling) ;;
      plane-polling) args=(--rig spillway); envs=(UCXPY_PROGRESS_MODE=polling) ;;
      comm) args=(--rig spillway --option data-plane=false) ;;
      dask-cuda) args=(--rig dask-cuda) ;;
    esac
    echo "== moves $rig ${envs[*]}" | tee -a "$log"
    env "${envs[@]}" timeout -k 10 180 python3 -m spillway_bench.transfers --device 0,1 --sizes "$sizes" \
      --repeats "$repeats" "${args[@]}" >"$out/moves-$rig.json" 2>>"$log"
    rc_moves="$rc_moves $rig:$?"
  done
fi

if has bench && fits 240 bench; then
  echo "== spillway bench --sizes full --devices 0,1 --timeline ${BENCH_FLAGS:-}" | tee -a "$log"
  # shellcheck disable=SC2086
  timeout -k 10 $(( $(left) - 20 )) python3 -m spillway bench --sizes full --devices 0,1 --timeline \
    --label two-gpus --out "$results/results" ${BENCH_FLAGS:-} >>"$log" 2>&1
  rc_bench=$?
fi

if has rechunk && fits 90 rechunk; then
  echo "== spillway run rechunk 158113x158113 chunks=1000 --devices 0,1 --verify" | tee -a "$log"
  bash benchmarks/gpu-host/watch-host.sh start "$out/host.log" 2
  timeout -k 10 $(( $(left) - 10 )) python3 -m spillway run rechunk --param size=158113x158113 --param chunks=1000 \
    --devices 0,1 --local-directory "$scratch" --verify --json --no-progress >"$out/rechunk.json" 2>>"$log"
  rc_rechunk=$?
  bash benchmarks/gpu-host/watch-host.sh stop "$out/host.log" | tee -a "$log"
fi

if has tests && fits 100 tests; then
  echo "== pytest -m gpu (data plane, transfers)" | tee -a "$log"
  # shellcheck disable=SC2086
  timeout -k 10 $(( $(left) - 10 )) python3 -m pytest -m gpu -v -p no:cacheprovider --timeout 240 -rfEs \
    ${TESTS:-tests/datapath/test_dataplane_gpu.py tests/datapath/test_transfer.py} >"$out/tests.log" 2>&1
  rc_tests=$?
  grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$out/tests.log" | cut -c1-160 | tee -a "$log"
  grep -E "^E  " "$out/tests.log" | head -10 | tee -a "$log"
fi

tar -czf "$out/results.tar.gz" -C "$results" results 2>/dev/null
echo "== summary (exit codes: moves$rc_moves bench $rc_bench rechunk $rc_rechunk tests $rc_tests; $(( $(date +%s) - start )) s)"
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
for rig in ("plane", "plane-polling", "comm", "dask-cuda"):
    try:
        text = open(os.path.join(out, f"moves-{rig}.json")).read()
        r = json.loads(text[text.index('{"rig"'):].splitlines()[0])  # UCX may warn on stdout first
    except FileNotFoundError:
        continue  # a rig not run
    except (OSError, ValueError) as e:
        print(f"moves {rig}: no result ({e})"); continue
    peers = {k: v["gbps"].get("peer_copy") for k, v in (r.get("ceilings") or {}).items()}
    for m in r["moves"]:
        peer = peers.get(str(m["bytes"]))
        print(f"moves {rig:9} {m['bytes'] / 2**20:7.0f} MiB  median {m['median_s'] * 1e3:7.3f} ms  "
              f"{m['gbps_median']:7.1f} GB/s" + (f" ({m['gbps_median'] / peer:.0%} of peer {peer:.0f})" if peer else "")
              + f"  bits {'same' if m['same_bits'] else 'DIFFER'}")
    for worker, c in sorted((r.get("data_plane") or {}).items()):
        if c:
            print(f"   plane {worker}: fetched {c['fetched']} served {c['served']} busy {c['busy']} lost {c['lost']}; "
                  "median ms " + " ".join(f"{k} {v['median_s'] * 1e3:.3f}" for k, v in (c.get("phases") or {}).items()))
try:
    r = json.load(open(os.path.join(out, "rechunk.json")))
    print(f"rechunk 200 GB: wall {r.get('wall_s')} s, verify {r.get('verify')}, spilled {r.get('bytes_spilled')}")
except (OSError, ValueError) as e:
    print(f"rechunk: no result ({e})")
PY
grep -E "data plane:" "$log" | cut -c1-300
grep -E "^workload|^W[1-5] +[0-9.]+ +[0-9.]+|^B[1-5] +[0-9.]+" "$log" | tail -12
