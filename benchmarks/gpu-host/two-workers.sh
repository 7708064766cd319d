#!/usr/bin/env bash
# Two workers on ONE GPU (issue 30, `workers-per-gpu 2`) on nvidia-h100-x1, in one call of
# under 9 minutes (PARTS to split it over two calls):
#   tests      the GPU tests of two workers on one GPU (tests/service/test_shared_gpu.py):
#              chunks over UCXX named as CUDA IPC within one GPU, bits kept, spilling per
#              worker, spillway.local(workers_per_gpu=2); and the spec walk (CPU)   ~2.5 min
#   run        spillway run transpose-sum --workers-per-gpu 2 --verify              ~0.5 min
#   link       spillway bench --link-sweep on the two workers' GPU at the transfer sizes: the
#              same-GPU copy ceiling, UCXX alone between two processes on it, pinned copies ~1 min
#   transfers  one CuPy array moved between the two workers, 16 MiB / 256 MiB / 1 GiB / 4 GiB,
#              5 timed moves each after a warm-up, time from the receiver's incoming transfer
#              log, bits compared: spillway's cluster, then plain dask-cuda (a scheduler and
#              two `dask cuda worker` processes with CUDA_VISIBLE_DEVICES=0, protocol ucx) ~2 min
#   bench      W1-W5 (small) on spillway's two workers beside the same plain dask-cuda rig,
#              ceilings measured in the same run                                      ~3 min
# With the UCXX wheel set (/work/shared/gpu-host/fetch-wheels.sh .whl, 41 MiB; carry .whl):
#   bash .whl/install-wheels.sh .whl && export PYTHONPATH=/tmp/site:$PWD
#   bash benchmarks/gpu-host/two-workers.sh                       # everything, budget 530 s
#   PARTS="tests run link transfers" bash benchmarks/gpu-host/two-workers.sh; PARTS=bench bash ...
# Parts that would not finish inside the budget are skipped with a line naming PARTS to
# run them. Files under $OUT (at most 8): two-workers.log (everything), tests.log,
# transfers-spillway.json, transfers-dask-cuda.json, results/<machine>-<date>-two-workers.{json,md}
# and ...-link-two-workers.json. The short table is printed last.
set -uo pipefail
out=${OUT:-/tmp/two-workers}
mkdir -p "$out/results"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
budget=${BUDGET_S:-530}
parts=" ${PARTS:-tests run link transfers bench} "
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
    --timeout 150 -rfEs tests/service/test_shared_gpu.py tests/service/test_worker_spec.py >"$out/tests.log" 2>&1
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
    --label two-workers --out "$out/results" >>"$log" 2>&1
  link_rc=$?
fi

if has transfers && fits 150 transfers; then
  echo "== transfers between the two workers: spillway" | tee -a "$log"
  timeout -k 10 150 python3 -m spillway.bench.transfers --rig spillway --sizes "$sizes" \
    >"$out/transfers-spillway.json" 2>>"$log"
  sp_rc=$?
  echo "== transfers between the two workers: plain dask-cuda (scheduler + 2 x dask cuda worker)" | tee -a "$log"
  timeout -k 10 150 python3 -m spillway.bench.transfers --rig dask-cuda --sizes "$sizes" \
    >"$out/transfers-dask-cuda.json" 2>>"$log"
  dc_rc=$?
fi

if has bench && fits 150 bench; then
  echo "== spillway bench --only W1,W2,W3,W4,W5 --sizes small --devices 0 --workers-per-gpu 2" | tee -a "$log"
  t=$(( $(left) - 15 ))
  timeout -k 10 "$t" python3 -m spillway bench --only W1,W2,W3,W4,W5 --sizes "${BENCH_SIZES:-small}" --runs 3 \
    --devices 0 --workers-per-gpu 2 --timeout 120 --label two-workers --out "$out/results" >>"$log" 2>&1
  bench_rc=$?
fi

echo "== exit codes: tests $tests_rc, run $run_rc, link $link_rc, transfers spillway $sp_rc / dask-cuda $dc_rc, bench $bench_rc ($(( $(date +%s) - start )) s)" | tee -a "$log"
python3 - "$out" <<'PY'
import glob, json, os, sys

out = sys.argv[1]


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


def mib(n):
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.0f} GiB"


links = sorted(glob.glob(f"{out}/results/*-link-two-workers.json"))
link = load(links[-1]) if links else None
ceiling = {}
if link:
    for i, n in enumerate(link["message_bytes"]):
        ceiling[n] = {k: v[i] for k, v in link["gbps"].items()}
sp, dc = load(f"{out}/transfers-spillway.json"), load(f"{out}/transfers-dask-cuda.json")
for name, r in (("spillway", sp), ("dask-cuda", dc)):
    if r:
        print(f"{name}: transport {r.get('transport')}; started in {r.get('start_s', 0):.1f} s")
print("\ntransfer between the 2 workers of GPU 0 (median of 5, receiver's log; ceiling: one copy within the GPU)")
print(f"{'size':>8} | {'spillway ms':>11} | {'GB/s':>6} | {'% ceil':>6} | {'dask-cuda ms':>12} | {'GB/s':>6} | "
      f"{'copy ms':>7} | {'UCXX alone GB/s':>15} | bits")
rows = {m["bytes"]: m for m in (sp or {}).get("moves", [])}
base = {m["bytes"]: m for m in (dc or {}).get("moves", [])}
for n in sorted(set(rows) | set(base) | set(ceiling)):
    s, b, c = rows.get(n, {}), base.get(n, {}), ceiling.get(n, {})
    copy = c.get("same_gpu_copy")
    copy_ms = n / (copy * 1e9) * 1e3 if copy else None
    f = lambda v, fmt: fmt.format(v) if v is not None else "-"  # noqa: E731
    pct = (s["gbps_median"] / copy * 100) if s.get("gbps_median") and copy else None
    print(f"{mib(n):>8} | {f(s.get('median_s') and s['median_s'] * 1e3, '{:.2f}'):>11} | "
          f"{f(s.get('gbps_median'), '{:.1f}'):>6} | {f(pct, '{:.0f}%'):>6} | "
          f"{f(b.get('median_s') and b['median_s'] * 1e3, '{:.2f}'):>12} | {f(b.get('gbps_median'), '{:.1f}'):>6} | "
          f"{f(copy_ms, '{:.2f}'):>7} | {f(c.get('ucxx_send_recv'), '{:.1f}'):>15} | "
          f"{'same' if s.get('same_bits', True) and b.get('same_bits', True) else 'DIFFERENT'}")
benches = [p for p in sorted(glob.glob(f"{out}/results/*-two-workers.json")) if "-link-" not in p]
if benches:
    r = load(benches[-1])
    print(f"\nW1-W5 on 2 workers of GPU 0, spillway vs plain dask-cuda (same rig), {r.get('scale', '')} sizes; "
          f"ceiling used: {r.get('ceilings', {}).get('peer_copy') or r.get('ceilings', {}).get('gbps', {}).get('same_gpu_copy')}")
    print(f"{'work':<4} | {'spillway s':>10} | {'dask-cuda s':>11} | {'speedup':>7} | transfers GB/s (median)")
    for w in r.get("workloads", []):
        f = lambda v, fmt: fmt.format(v) if v is not None else "-"  # noqa: E731
        print(f"{w['name']:<4} | {f(w.get('spillway_s'), '{:.3f}'):>10} | {f(w.get('baseline_s'), '{:.3f}'):>11} | "
              f"{f(w.get('speedup'), '{:.2f}x'):>7} | {f(w.get('transfer_gbps_median'), '{:.1f}')} / "
              f"{f(w.get('baseline_transfer_gbps_median'), '{:.1f}')}"
              + (f"  baseline: {w['baseline_error'][:60]}" if w.get("baseline_error") else ""))
PY
