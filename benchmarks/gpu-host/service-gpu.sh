#!/usr/bin/env bash
# The shared service on one GPU past its memory, from the defaults, as a new user meets it:
#   spillway tenant add alice / bob        (no options: the cluster's admission is the limit)
#   spillway serve --port 8765             (defaults: one worker per GPU)
#   spillway.connect(url, token).submit("rechunk", size=<1.35x the GPU>, verify=True)
# then the same job from alice and bob submitted together (one runs, the other says it waits
# for memory, then runs), `free -m` sampled every 2 s meanwhile, dmesg read for OOM kills, and
# the one-GPU service test (tests/service/api/test_gpu_service_one.py).
#   usage: benchmarks/gpu-host/service-gpu.sh [FACTOR]     (default 1.35)
# On nvidia-h100-x1 the one job (108 GB of footprint) took 16.5 s; the whole script takes
# about 4-6 minutes. Installs only the service wheel set (.whl-svc, fetch-test-wheels.sh).
# Writes under $OUT: service-gpu.json (jobs, reports, waiting reasons), serve.log,
# free.log, dmesg.txt, gpu-test.log; prints a short table last.
set -uo pipefail
factor=${1:-1.35}
out=${OUT:-/tmp/service-gpu-out}
mkdir -p "$out"
# CPU=1: the same on 2 CPU workers at FACTOR x a 48 MiB stand-in, with what is installed
# (a try of the script anywhere; the GPU test skips itself)
if [ "${CPU:-0}" = 1 ]; then
  serve_flags=(--cpu --n-workers 2); scale="cpu"
else
  bash .whl-svc/install-wheels.sh .whl-svc >"$out/install.log" 2>&1 || { tail -5 "$out/install.log"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
  serve_flags=(); scale="gpu"
fi
state=$(mktemp -d /tmp/spillway-service-XXXX)
port=8765
dmesg 2>/dev/null | grep -ci "killed process" >"$out/oom-before.txt" || true

# host memory every 2 s (used, available MiB), in the background for the whole script
( while :; do echo "$(date +%s) $(free -m | awk 'NR==2 {print $3, $7}')"; sleep 2; done ) >"$out/free.log" &
sampler=$!
serve_pid=
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  kill "$sampler" 2>/dev/null
}
trap cleanup EXIT

alice=$(python3 -m spillway tenant add alice --state-dir "$state" | tail -1)
bob=$(python3 -m spillway tenant add bob --state-dir "$state" | tail -1)
python3 -m spillway tenant list --state-dir "$state" >"$out/tenants.txt"
python3 -m spillway serve --state-dir "$state" --port "$port" "${serve_flags[@]}" >"$out/serve.log" 2>&1 &
serve_pid=$!

timeout -k 10 280 python3 - "$out" "$port" "$alice" "$bob" "$factor" "$scale" <<'PY'
import json, sys, time
import httpx
import spillway
from spillway_bench.matrix import Case, cpu_scale, gpu_scale, workflow_params

out, port, alice, bob, factor, kind = sys.argv[1:7]
factor = float(factor)
url = f"http://127.0.0.1:{port}"
t0 = time.monotonic()
while True:
    try:
        if httpx.get(url + "/healthz", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() - t0 > 150:
        sys.exit("spillway serve did not answer in 150 s; see serve.log")
    time.sleep(1)
print(f"service up in {time.monotonic() - t0:.0f} s", flush=True)
params, projected = workflow_params(Case("rechunk", "service"),
                                    gpu_scale(factor) if kind == "gpu" else cpu_scale(factor=factor))
record = {"params": params, "projected_bytes": projected, "runs": []}


def save():
    # after every job: a call cut off by its time limit keeps what finished
    json.dump(record, open(f"{out}/service-gpu.json", "w"), indent=1, default=str)


def finished(job, submit_s, waited):
    res = job.result(timeout=200)
    r = dict(res.report)
    status = job.status()
    return {"id": job.id, "tenant": status["tenant"], "state": status["state"], "submit_s": submit_s,
            "wall_s": r["wall_s"], "verify": r["verify"], "footprint": r["footprint"]["total_bytes"],
            "peak_device": r["peak_bytes_per_worker"], "peak_host": r.get("peak_host_bytes_per_worker"),
            "moved": r.get("spilled_by_tier"), "transport": r.get("transport"), "waiting_seen": waited,
            "started": status["timings"]["started"], "finished": status["timings"]["finished"]}


def submit(client):
    t = time.perf_counter()
    job = client.submit("rechunk", params, verify=True)
    return job, time.perf_counter() - t


a, b = spillway.connect(url, alice), spillway.connect(url, bob)
try:
    # one job past the GPU, by a tenant added with no options
    job, s = submit(a)
    record["runs"].append(["one", finished(job, s, None)])
    save()
    # two together, from two tenants: the second waits for memory, then runs
    (ja, sa), (jb, sb) = submit(a), submit(b)
    waited = {ja.id: None, jb.id: None}
    # both refreshed on every pass (any() over the calls would stop at the first running
    # job and leave the queued one's record, and its reason, as it was at submission)
    while any([j.status()["state"] in ("queued", "running") for j in (ja, jb)]):
        for j in (ja, jb):
            # the reason the scheduler gave (not the moment before it first looked)
            if (j.record.get("waiting") or "").startswith("waiting") and waited[j.id] is None:
                waited[j.id] = j.record["waiting"]
                print(f"{j.id[:8]} ({j.record['tenant']}): {j.record['waiting']}", flush=True)
        time.sleep(0.5)
    record["runs"] += [["two", finished(ja, sa, waited[ja.id])], ["two", finished(jb, sb, waited[jb.id])]]
except Exception as e:  # the record keeps what finished; the table says what failed
    record["error"] = f"{type(e).__name__}: {e}"
    print(record["error"], flush=True)
finally:
    save()
PY
rc=$?
kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null; serve_pid=
rm -rf "$state"

# the one-GPU service test, its own service
timeout -k 10 180 python3 -m pytest -m gpu -q -p no:cacheprovider tests/service/api/test_gpu_service_one.py \
  --timeout 170 -rfE >"$out/gpu-test.log" 2>&1
test_rc=$?
kill "$sampler" 2>/dev/null
dmesg 2>/dev/null | grep -i "killed process" >"$out/dmesg.txt"
oom=$(( $(wc -l <"$out/dmesg.txt") - $(cat "$out/oom-before.txt" 2>/dev/null || echo 0) ))

grep -E "^E |passed|failed" "$out/gpu-test.log" | tail -5
cat "$out/tenants.txt"
python3 - "$out" "$oom" "$rc" "$test_rc" <<'PY'
import json, sys
from spillway.options.sizes import format_bytes
out, oom, rc, test_rc = sys.argv[1:]
rows = [line.split() for line in open(f"{out}/free.log") if len(line.split()) == 3]
low = min((int(r[2]) for r in rows), default=None)
peak_used = max((int(r[1]) for r in rows), default=None)
try:
    rec = json.load(open(f"{out}/service-gpu.json"))
except (OSError, ValueError):
    rec = {"runs": [], "error": "no record"}
print(f"rechunk at {format_bytes(rec.get('projected_bytes') or 0)} projected ({rec.get('params', {}).get('size')})")
print("| run | tenant | state | verified (rel error) | submit s | wall s | peak device | peak host | "
      "D->H / H->D | started -> finished | waited |")
print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
for part, r in rec["runs"]:
    v = r["verify"] or {}
    dev = max((p for p in r["peak_device"].values() if p), default=0)
    host = max((p for p in (r["peak_host"] or {}).values() if p), default=0)
    m = r["moved"] or {}
    print(f"| {part} | {r['tenant']} | {r['state']} | {v.get('ok')} ({v.get('rel_error') or 0:.1e}) "
          f"| {r['submit_s']:.2f} | {r['wall_s']:.1f} | {format_bytes(dev)} | {format_bytes(host)} "
          f"| {format_bytes(m.get('device_to_host', 0))} / {format_bytes(m.get('host_to_device', 0))} "
          f"| {r['started'][11:19]} -> {r['finished'][11:19]} | {(r['waiting_seen'] or '—')[:70]} |")
if rec.get("error"):
    print("error:", rec["error"])
print(f"host: peak used {peak_used} MiB, lowest available {low} MiB (free -m every 2 s); OOM kills: {oom}; "
      f"driver exit {rc}; GPU test exit {test_rc}")
PY
