#!/usr/bin/env bash
# Issue 60 on one host, in one device call: a user's FFT-rechunk-FFT past the GPUs' memory
# (benchmarks/gpu-host/user_fft.py) in several variants, each on a fresh cluster, the
# host's memory watched, RMM's error lines and OOM kills counted, a table last.
#   usage: benchmarks/gpu-host/user-fft.sh
#   env:   N (100000 on 2 x H200) PANEL=1000 IDLE=60 VARIANTS="touch spillway tasks dask-cuda"
#          (touch: the host's first-touch rates, benchmarks/gpu-host/first-touch.py, first)
#          variants also: rechunk-spillway, rechunk-tasks (a user's x.rechunk of a persisted
#          RECHUNK_N^2 field, 150000 by default: 180 GB, row panels to column panels,
#          persisted beside it), bench (spillway bench --sizes full of BENCH_ONLY, W1-W5 by
#          default, dask-cuda beside it), probe-spillway, probe-dask-cuda (the ten-run probe of an in-memory
#          (x + x.T).sum(): a fresh cluster's first run), rechunk200 (the 200 GB panel
#          rechunk workflow, verified)
# Assumes the wheels are installed and PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks. Writes under $OUT:
#   user-fft.md (the table) and user-fft.tar.gz (each variant's JSON, log, host samples)
set -uo pipefail
final=${OUT:-/tmp/user-fft-out}
out=$(mktemp -d /tmp/user-fft.XXXXXX)
mkdir -p "$final"
here=$(dirname "$0")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# the issue's size on 2 x H200: a 100000^2 field (80 GB, 0.28x the GPUs' 287 GB; the peak
# about 1.4x them); elsewhere the same share of the GPUs' memory
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{s+=$1} END{print s}')
n=${N:-$(python3 -c "import math; print(min(100000, int(math.sqrt(0.278 * $total_mib * 2**20 / 8) // 1000 * 1000)))")}
panel=${PANEL:-1000}; idle=${IDLE:-60}
table="$out/user-fft.md"
{ echo "# user FFT-rechunk-FFT, ${n}^2 float64 field, panels of $panel ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c
  free -g | head -2
  echo
  echo "| variant | start | persist | fresh run | after idle | rel err | D->H GB | H->D GB | to disk GB | RMM error lines | host min avail MiB | OOM |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"; } > "$table"
for v in ${VARIANTS:-touch spillway tasks dask-cuda}; do
  case $v in
    touch) timeout 120 python3 "$here/first-touch.py" 2 2>&1 | tee "$out/first-touch.txt"; continue ;;
    probe-spillway|probe-dask-cuda)
      timeout -k 10 150 python3 "$here/ten_runs.py" --rig "${v#probe-}" --devices "${DEVICES:-0,1}" \
        > "$out/$v.json" 2> "$out/$v.log"
      echo "$v rc=$?"; tail -c 600 "$out/$v.json"; echo; continue ;;
    bench)
      timeout -k 10 "${BENCH_S:-330}" python3 -m spillway bench --sizes full --devices "${DEVICES:-0,1}" \
        --only "${BENCH_ONLY:-W1,W2,W3,W4,W5}" --label "${LABEL:-user-fft}" --out "$out/bench" > "$out/bench.log" 2>&1
      echo "bench rc=$?"; grep -E "^\| W|^\| O|x dask|slower" "$out"/bench/*.md 2>/dev/null | head -20
      tail -3 "$out/bench.log"; continue ;;
    rechunk200)
      bash "$here/watch-host.sh" start "$out/host-$v.log" 1
      /usr/bin/time -v timeout -k 10 240 python3 -m spillway run rechunk --param size=158113x158113 \
        --param chunks=1000 --devices "${DEVICES:-0,1}" --verify > "$out/$v.log" 2>&1
      echo "$v rc=$?"; grep -iE "verif|seconds|elapsed|spill|error" "$out/$v.log" | tail -12
      bash "$here/watch-host.sh" stop "$out/host-$v.log"; continue ;;
    spillway) args=(--side spillway --idle "$idle") ;;
    tasks) args=(--side spillway --method tasks) ;;
    rechunk-spillway) args=(--side spillway --workload rechunk --n "${RECHUNK_N:-150000}") ;;
    rechunk-tasks) args=(--side spillway --workload rechunk --method tasks --n "${RECHUNK_N:-150000}") ;;
    dask-cuda) args=(--side dask-cuda) ;;
    *) echo "unknown variant $v"; continue ;;
  esac
  bash "$here/watch-host.sh" start "$out/host-$v.log" 1
  timeout -k 10 "${LIMIT:-300}" python3 "$here/user_fft.py" --n "$n" "${args[@]}" --panel "$panel" \
    --out "$out/user-fft-$v.json" > "$out/user-fft-$v.log" 2>&1
  rc=$?
  grep "^user-fft" "$out/user-fft-$v.log"
  [ -s "$out/user-fft-$v.json" ] || grep -vE "^\s" "$out/user-fft-$v.log" | grep -iE "error|exception" | tail -4
  watch=$(bash "$here/watch-host.sh" stop "$out/host-$v.log")
  echo "$watch"
  errors=$(grep -ci "maximum pool size exceeded" "$out/user-fft-$v.log")
  minavail=$(awk '{for(i=1;i<=NF;i++) if($i ~ /^avail=/){split($i,a,"="); if(m==""||a[2]<m) m=a[2]}} END{print m}' "$out/host-$v.log")
  oom=$(echo "$watch" | sed -n "s/^OOM kills since start: \([0-9]*\).*/\1/p")
  python3 - "$out/user-fft-$v.json" "$v" "$rc" "$errors" "$minavail" "${oom:-0}" >> "$table" <<'PY'
import json, sys
path, v, rc, errors, minavail, oom = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception:
    print(f"| {v} | exit {rc}: no result | | | | | | | | {errors} | {minavail} | {oom} |")
    sys.exit()
runs = {x["run"]: x for x in r["runs"]}
f, i = runs.get("fresh", {}), runs.get("idle", {})
sp = f.get("spilled") or {}
chk = f.get("check") or {}
g = lambda k: f"{sp.get(k, 0) / 1e9:.1f}" if sp else "-"
s = lambda x: f"{x['seconds']:.2f} s" if x else "-"
print(f"| {v} | {r.get('start_s', 0):.1f} s | {r.get('persist_s', 0):.1f} s | {s(f)} | {s(i)} | "
      f"{chk.get('rel_err', float('nan')):.1e} | {g('device_to_host')} | {g('host_to_device')} | {g('host_to_disk')} | "
      f"{errors} | {minavail} | {oom} |")
PY
done
cp "$table" "$final/"
tar czf "$final/user-fft.tar.gz" -C "$out" .
cat "$table"
