#!/usr/bin/env bash
# Two workers on ONE GPU (issue 30, `workers-per-gpu 2`) on nvidia-h100-x1, in one call of
# under 9 minutes (PARTS splits it over calls; parts that would not finish inside the
# budget are skipped with a line naming the PARTS that runs them):
#   tests      the GPU tests of two workers on one GPU (tests/datapath/test_shared_gpu.py):
#              chunks over UCXX named as CUDA IPC within one GPU, bits kept, spilling per
#              worker, spillway.local(workers_per_gpu=2)                            ~2.5 min
#   run        spillway run transpose-sum --workers-per-gpu 2 --verify                ~0.5 min
#   link       spillway bench --link-sweep on the two workers' GPU at the transfer sizes: the
#              same-GPU copy ceiling (one copy within HBM), UCXX alone between two processes
#              on the GPU, pinned copies                                              ~1 min
#   transfers  one CuPy array moved between the two workers at each size, a warm-up and 5
#              timed moves, the time from the receiver's incoming transfer log, the bits
#              compared: spillway's cluster, then plain dask-cuda (a scheduler and two
#              `dask cuda worker --protocol ucx` with CUDA_VISIBLE_DEVICES=0)        ~2 min
#   pool       the same plain dask-cuda rig with an RMM pool (--rmm-pool-size 0.45 each): what
#              a pool (IPC handles opened once) alone does to each transfer           ~1 min
#   bench      W1-W5 (small) on spillway's two workers beside the same plain dask-cuda rig, with
#              each worker's timeline of the first timed run (--timeline, issue 15's, on one GPU),
#              the ceilings (same-GPU copy) measured in the same run                  ~3 min
#   knobs      (not by default: PARTS=knobs) spillway's transfers again under each setting
#              that may change the cost of one message, each in knobs/<name>.json of
#              results.tar.gz: distributed's offload threshold raised above every size
#              (no hop to the offload thread on either side), ucxx's progress thread with
#              its requests completed as asyncio futures (python-future: no coroutine
#              polling asyncio.sleep(0) while a comm waits, so the event loop stops holding
#              the GIL), both, ucxx's progress mode alone (thread, thread-polling; the
#              default is blocking), distributed-ucxx's multi-buffer last (it hung); the
#              threshold also through spillway's option (transfer-offload=1TiB)        ~6 min
#   anatomy    (not by default: PARTS=anatomy, a call of its own) where one transfer's time
#              goes: python -m spillway_bench.transfer_anatomy at 16 MiB, 256 MiB, 1 GiB:
#              raw ucxx, distributed's comm layer alone (with/without the offload thread,
#              with/without python futures), two spillway workers split by their own books,
#              the comm layer with multi-buffer; anatomy.json in results.tar.gz, its table
#              in the log and printed last                                            ~5 min
#   zarr       (not by default: PARTS=zarr, a call of its own) the Zarr bench (small, 12 GB,
#              KvikIO) with one and with two workers on the GPU: does a second worker
#              overlap the reads with the decode and the copies                       ~6 min
# With the UCXX wheel set (/work/shared/gpu-host/fetch-wheels.sh .whl, 41 MiB; carry .whl):
#   bash .whl/install-wheels.sh .whl && export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
#   bash benchmarks/gpu-host/two-workers.sh       # all but zarr, in this order, budget 530 s
#   PARTS="tests run link transfers" bash ...; PARTS="bench pool" bash ...; PARTS=zarr bash ...
#   PARTS=anatomy bash ...; PARTS=knobs bash ...
# Files under $OUT (at most 8): two-workers.log (all output), tests.log, run.json,
# transfers-{spillway,dask-cuda,dask-cuda-pool}.json, results.tar.gz (the bench's, link
# sweep's and Zarr bench's json/md/png). The short table is printed last.
set -uo pipefail
out=${OUT:-/tmp/two-workers}
mkdir -p "$out"
# the bench's files go here and travel back as one archive (a call returns at most 8 files)
results=$(mktemp -d "${SCRATCH:-/tmp}/two-workers-XXXXXX")
# the Zarr stores and the workers' spill space: a real disk, not tmpfs, and not archived
scratch=$(mktemp -d "${SCRATCH:-/tmp}/two-workers-scratch-XXXXXX")
trap 'rm -rf "$scratch" "$results"' EXIT
mkdir -p "$results/results"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
budget=${BUDGET_S:-530}
parts=" ${PARTS:-tests run link transfers bench pool} "
sizes=${SIZES:-16MiB,256MiB,1GiB,4GiB}
has() { [[ "$parts" == *" $1 "* ]]; }
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
log="$out/two-workers.log"
# fits SECONDS: whether a part of about that many seconds still fits the budget
fits() { if [ "$(left)" -ge "$1" ]; then return 0; fi
         echo "== $2 skipped: $(left) s left of the budget, it needs about $1 s; run it with PARTS=$2" | tee -a "$log"
         return 1; }
{ nvidia-smi -L; nvidia-smi --query-gpu=memory.total,memory.used --format=csv; free -g | head -2
  python3 -c "import distributed_ucxx, dask_cuda; print('dask-cuda', dask_cuda.__version__, 'distributed-ucxx ok')"
  DASK_SPILLWAY__WORKERS_PER_GPU=2 python3 -m spillway info 2>&1 || true; } >"$log" 2>&1
grep -E "^transport|^GPU 0" "$log"

tests_rc=skipped run_rc=skipped link_rc=skipped sp_rc=skipped dc_rc=skipped bench_rc=skipped
if has tests && fits 160 tests; then
  echo "== GPU tests (two workers on one GPU)" | tee -a "$log"
  timeout -k 10 $(( $(left) < 240 ? $(left) : 240 )) python3 -m pytest -m gpu -v -p no:cacheprovider \
    --timeout 150 -rfEs tests/datapath/test_shared_gpu.py >"$out/tests.log" 2>&1
  tests_rc=$?
  grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$out/tests.log" | cut -c1-160 | tee -a "$log"
  grep -E "^E  " "$out/tests.log" | head -10 | tee -a "$log"
fi

if has run && fits 60 run; then
  echo "== spillway run transpose-sum --workers-per-gpu 2 --verify" | tee -a "$log"
  timeout -k 10 120 python3 -m spillway run transpose-sum --param size=20000x20000 --param chunks=5000x5000 \
    --devices 0 --workers-per-gpu 2 --verify --json --no-progress >"$out/run.json" 2>>"$log"
  run_rc=$?
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('run:', r.get('cluster'), '| transport', r.get('transport'), '| verify', r.get('verify'), '| bytes transferred', r.get('bytes_transferred'))" "$out/run.json" 2>&1 | cut -c1-400 | tee -a "$log"
fi

if has link && fits 90 link; then
  echo "== spillway bench --link-sweep --devices 0 --workers-per-gpu 2" | tee -a "$log"
  timeout -k 10 150 python3 -m spillway bench --link-sweep --devices 0 --workers-per-gpu 2 --sweep-sizes "$sizes" \
    --label two-workers --out "$results/results" >>"$log" 2>&1
  link_rc=$?
fi

if has transfers && fits 150 transfers; then
  echo "== transfers between the two workers: spillway" | tee -a "$log"
  timeout -k 10 150 python3 -m spillway_bench.transfers --rig spillway --sizes "$sizes" \
    >"$out/transfers-spillway.json" 2>>"$log"
  sp_rc=$?
  echo "== transfers between the two workers: plain dask-cuda (scheduler + 2 x dask cuda worker)" | tee -a "$log"
  timeout -k 10 150 python3 -m spillway_bench.transfers --rig dask-cuda --sizes "$sizes" \
    >"$out/transfers-dask-cuda.json" 2>>"$log"
  dc_rc=$?
fi

if has bench && fits 150 bench; then
  echo "== spillway bench --only W1,W2,W3,W4,W5 --sizes small --devices 0 --workers-per-gpu 2" | tee -a "$log"
  t=$(( $(left) - 15 ))
  timeout -k 10 "$t" python3 -m spillway bench --only W1,W2,W3,W4,W5 --sizes "${BENCH_SIZES:-small}" --runs 3 \
    --devices 0 --workers-per-gpu 2 --timeout 120 --timeline --label "${BENCH_LABEL:-two-workers}" \
    ${BENCH_FLAGS:-} --out "$results/results" >>"$log" 2>&1
  bench_rc=$?
fi

pool_rc=skipped
if has pool && fits 75 pool; then
  echo "== transfers between the two workers: plain dask-cuda with an RMM pool (0.45 of the GPU each)" | tee -a "$log"
  timeout -k 10 120 python3 -m spillway_bench.transfers --rig dask-cuda --sizes "$sizes" \
    --worker-flag=--rmm-pool-size=0.45 --worker-flag=--rmm-allocator-external-lib-list=cupy \
    >"$out/transfers-dask-cuda-pool.json" 2>>"$log"
  pool_rc=$?
fi

knobs_rc=skipped
if has knobs; then
  mkdir -p "$results/results/knobs"
  knobs_rc=
  no_offload="DASK_DISTRIBUTED__COMM__OFFLOAD=1TiB"
  python_future="UCXPY_PROGRESS_MODE=thread UCXPY_ENABLE_PYTHON_FUTURE=1"
  # name|environment|transfers.py arguments; transfer-offload: the same threshold through
  # spillway's option (WorkerSetup moves it in each worker) instead of the variable
  for knob in "default||" "no-offload|$no_offload|" "transfer-offload||--option=transfer-offload=1TiB" \
              "python-future|$python_future|" \
              "no-offload+python-future|$no_offload $python_future|" "thread|UCXPY_PROGRESS_MODE=thread|" \
              "thread-polling|UCXPY_PROGRESS_MODE=thread-polling|" \
              "multi-buffer|DASK_DISTRIBUTED_UCXX__MULTI_BUFFER=True|" \
              "multi-buffer+thread|DASK_DISTRIBUTED_UCXX__MULTI_BUFFER=True UCXPY_PROGRESS_MODE=thread|" \
              "uvloop|DASK_DISTRIBUTED__ADMIN__EVENT_LOOP=uvloop|" \
              "event-loop-uvloop||--option=event-loop=uvloop"; do
    IFS='|' read -r name vars knob_args <<<"$knob"
    # KNOBS="default uvloop": only those (uvloop needs its wheel in the set: EXTRA=uvloop)
    [ -n "${KNOBS:-}" ] && [[ " $KNOBS " != *" $name "* ]] && continue
    fits 40 knobs || break
    echo "== transfers between the two workers: spillway, $name ($vars$knob_args)" | tee -a "$log"
    env $vars timeout -k 10 $(( $(left) < 90 ? $(left) : 90 )) python3 -m spillway_bench.transfers --rig spillway \
      --sizes "$sizes" $knob_args >"$results/results/knobs/$name.json" 2>>"$log"
    knobs_rc="$knobs_rc$?"
  done
fi

anatomy_rc=skipped
if has anatomy && fits 240 anatomy; then
  echo "== where one transfer's time goes: python -m spillway_bench.transfer_anatomy" | tee -a "$log"
  timeout -k 10 $(( $(left) - 10 )) python3 -m spillway_bench.transfer_anatomy --sizes "${ANATOMY_SIZES:-16MiB,256MiB,1GiB}" \
    --out "$results/results/anatomy.json" >>"$log" 2>&1
  anatomy_rc=$?
fi

zarr_rc=skipped
if has zarr && fits 330 zarr; then
  for n in 1 2; do
    echo "== spillway bench --zarr --sizes small --devices 0 --workers-per-gpu $n" | tee -a "$log"
    timeout -k 10 $(( $(left) / (3 - n) - 10 )) python3 -m spillway bench --zarr --sizes "${ZARR_SIZES:-small}" \
      --runs 2 --devices 0 --workers-per-gpu $n --local-directory "$scratch" --label "zarr-wpg$n" \
      --out "$results/results" >>"$log" 2>&1
    zarr_rc="$zarr_rc/$?"
  done
fi
tar czf "$out/results.tar.gz" -C "$results" results 2>/dev/null

echo "== exit codes: tests $tests_rc, run $run_rc, link $link_rc, transfers spillway $sp_rc / dask-cuda $dc_rc / pool $pool_rc, bench $bench_rc, knobs $knobs_rc, anatomy $anatomy_rc, zarr $zarr_rc ($(( $(date +%s) - start )) s)" | tee -a "$log"
python3 - "$out" "$results" <<'PY'
import glob, json, sys

out, results = sys.argv[1], sys.argv[2]


def load(path):
    """The JSON of ``path``: a results file, or the last JSON line a command printed."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for candidate in [text] + [line for line in reversed(text.splitlines()) if line.startswith("{")]:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def size(n):
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.0f} GiB"


def f(value, fmt):
    return "-" if value is None else fmt.format(value)


def ms(move):
    return None if not move.get("median_s") else move["median_s"] * 1e3


links = sorted(glob.glob(f"{results}/results/*-link-two-workers.json"))
link = load(links[-1]) if links else None
ceiling = {}
if link:
    for i, n in enumerate(link["message_bytes"]):
        ceiling[n] = {k: v[i] for k, v in link["gbps"].items()}
rigs = {name: load(f"{out}/transfers-{name}.json") for name in ("spillway", "dask-cuda", "dask-cuda-pool")}
for name, r in rigs.items():
    if r:
        print(f"{name}: transport {r.get('transport')}; started in {r.get('start_s', 0):.1f} s")
moves = {name: {m["bytes"]: m for m in (r or {}).get("moves", [])} for name, r in rigs.items()}
print("\nOne chunk between the 2 workers of GPU 0: ms per transfer (median of 5, receiver's log); "
      "copy = one copy within the GPU (the ceiling)")
print(f"{'size':>8} | {'spillway':>8} | {'GB/s':>6} | {'of copy':>7} | {'dask-cuda':>9} | {'+pool':>7} | "
      f"{'copy':>6} | {'UCXX alone GB/s':>15} | bits")
for n in sorted(set().union(*moves.values(), ceiling)):
    s, b, bp, c = (moves["spillway"].get(n, {}), moves["dask-cuda"].get(n, {}), moves["dask-cuda-pool"].get(n, {}),
                   ceiling.get(n, {}))
    copy = c.get("same_gpu_copy")
    of_copy = s["gbps_median"] / copy * 100 if s.get("gbps_median") and copy else None
    same = all(m.get("same_bits", True) for m in (s, b, bp))
    print(f"{size(n):>8} | {f(ms(s), '{:.2f}'):>8} | {f(s.get('gbps_median'), '{:.1f}'):>6} | "
          f"{f(of_copy, '{:.0f}%'):>7} | {f(ms(b), '{:.2f}'):>9} | {f(ms(bp), '{:.2f}'):>7} | "
          f"{f(copy and n / (copy * 1e9) * 1e3, '{:.2f}'):>6} | {f(c.get('ucxx_send_recv'), '{:.1f}'):>15} | "
          f"{'same' if same else 'DIFFERENT'}")
knobs = {p.rsplit("/", 1)[1][:-5]: load(p) for p in sorted(glob.glob(f"{results}/results/knobs/*.json"))}
if knobs:
    sizes = sorted({m["bytes"] for r in knobs.values() if r for m in r.get("moves", [])})
    print("\nspillway's transfers by UCXX setting: ms per transfer (median of 5)")
    print(f"{'setting':<22} | " + " | ".join(f"{size(n):>8}" for n in sizes))
    for name, r in knobs.items():
        by = {m["bytes"]: m for m in (r or {}).get("moves", [])}
        print(f"{name:<22} | " + " | ".join(f"{f(ms(by.get(n, {})), '{:.2f}'):>8}" for n in sizes))
benches = [p for p in sorted(glob.glob(f"{results}/results/*-two-workers.json")) if "-link-" not in p]
if benches:
    r = load(benches[-1])
    print(f"\nW1-W5 on 2 workers of GPU 0: spillway vs plain dask-cuda (scheduler + 2 x dask cuda worker), "
          f"{r.get('scale', '')} sizes, median s")
    print(f"{'work':<4} | {'spillway':>8} | {'dask-cuda':>9} | {'speedup':>7} | transfer GB/s median (spillway / dask-cuda)")
    for w in r.get("workloads", []):
        err = f"  baseline: {w['baseline_error'][:70]}" if w.get("baseline_error") else ""
        print(f"{w['name']:<4} | {f(w.get('spillway_s'), '{:.3f}'):>8} | {f(w.get('baseline_s'), '{:.3f}'):>9} | "
              f"{f(w.get('speedup'), '{:.2f}x'):>7} | {f(w.get('transfer_gbps_median'), '{:.1f}')} / "
              f"{f(w.get('baseline_transfer_gbps_median'), '{:.1f}')}{err}")
anatomy = load(f"{results}/results/anatomy.json")
if anatomy:
    from spillway_bench.transfer_anatomy import table

    print("\n" + table(anatomy))
zarr = {n: load(p) for n in (1, 2) for p in sorted(glob.glob(f"{results}/results/*-zarr-wpg{n}.json"))[-1:]}
if zarr:
    print("\nZarr (KvikIO) on GPU 0, seconds (median): 1 vs 2 workers on the GPU")
    for store in next(iter(zarr.values()))["stores"]:
        for what in ("write", "cold_read", "cached_read"):
            t = [zarr.get(n, {}).get("stores", {}).get(store, {}).get(what, {}).get("seconds") for n in (1, 2)]
            gain = f"{t[0] / t[1]:.2f}x" if all(t) else "-"
            print(f"{store:<14} {what:<12} {f(t[0], '{:.2f}'):>7} s | {f(t[1], '{:.2f}'):>7} s | {gain}")
PY
