#!/usr/bin/env bash
# Where a fresh cluster's start goes (issue 62): the ten-run probe with one run under
# py-spy (every process of the cluster, idle threads too, 100 samples a second) for each
# rig given, in the order given:
#   RIGS="wpg2:workers-per-gpu=2 default" bash benchmarks/gpu-host/start-profile.sh
# Writes under $OUT: start-NAME.txt (py-spy's collapsed stacks), start-NAME.json (the probe's
# line with its start steps); prints each rig's steps last.
set -u
out=${OUT:-/tmp/start-profile}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD:$PWD/benchmarks}
pip install -q --no-deps --target /tmp/pyspy "${PYSPY_WHEELS:-.whl-dbg}"/py_spy-*.whl 2>/dev/null
spy=$(ls /tmp/pyspy/bin/py-spy 2>/dev/null || command -v py-spy)
for rig in ${RIGS:-wpg2:workers-per-gpu=2 default}; do
  name=${rig%%:*}
  args=()
  if [[ "$rig" == *:* ]]; then IFS=, read -ra opts <<<"${rig#*:}"; for o in "${opts[@]}"; do args+=(--option "$o"); done; fi
  timeout -k 10 120 "$spy" record --subprocesses --idle --rate 100 --format raw -o "$out/start-$name.txt" -- \
    python3 benchmarks/gpu-host/ten_runs.py --rig spillway --runs 2 "${args[@]}" >"$out/start-$name.json" 2>"$out/start-$name.log"
  echo "== $name rc=$?"
done
for f in "$out"/start-*.json; do
  python3 -c "import json,sys; r=json.loads([l for l in open(sys.argv[1]) if l.startswith('{')][-1]); print(sys.argv[1].rsplit('/',1)[1], round(r['start_s'],2), r['start_steps'])" "$f" 2>/dev/null || echo "$f: no line"
done
