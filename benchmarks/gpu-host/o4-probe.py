"""O4's user code past one GPU, as short as a device call's last minutes allow: a fresh
``spillway.local()``, the complex field persisted, then two runs of
``fft(x.rechunk({0: -1, 1: 1000}), axis=0)`` persisted, each printed with its moves beside
the bytes its capacities force (:mod:`spillway_bench.forcedbound`), where its
device-to-host time went (host buffers: from where, and how long getting them took), what
went to disk and why (the drain, the machine's room, the host tier's limit; and how much of
it a task still waited for), and what the clean copies saved. Every half second the worker's
host side is sampled (host tier, arena used of its size, pageable, kept, pinned on demand,
clean copies, the worker's RSS, the machine's available memory) into
``$OUT/o4-samples.jsonl``; the sample where the machine had least is printed. No reference
check and no other side: ``ooc-bench.sh o4`` is the whole row.

    python3 benchmarks/gpu-host/o4-probe.py [FOOTPRINT_OVER_GPU | nN]   (default 2.2; n77000: that side)
    python3 benchmarks/gpu-host/o4-probe.py --plot SAMPLES.jsonl OUT.png   (the samples over time)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

GiB = 2**30


def host_sample(dask_worker) -> dict:
    """The worker's host side now (run on the worker)."""
    import psutil

    from spillway.launch.plugins import _tiered_store

    store = _tiered_store(dask_worker)
    if store is None:
        return {}
    s = store.summary()
    h = s["host"]
    return {"t": time.time(), "device": s["device_bytes"], "host_tier": s["host_bytes"],
            "disk": s["disk_bytes"], "clean": s["host_clean_bytes"], "held": s["held_bytes"],
            "arena": h["arena_bytes"], "arena_used": h["arena_used_bytes"],
            "pageable": h["pageable_bytes"], "kept": h["pageable_kept_bytes"],
            "pinned_od": h["pinned_on_demand_bytes"], "rss": psutil.Process().memory_info().rss,
            "avail": psutil.virtual_memory().available}


def sampling(client, out, stop: threading.Event, run: int) -> None:
    while not stop.wait(0.5):
        try:
            for sample in client.run(host_sample).values():
                out.write(json.dumps({"run": run, **sample}) + "\n")
        except Exception:  # noqa: BLE001 (a sample missed is a sample missed)
            pass


def main(factor: float, n_given: int | None = None) -> None:
    import dask.array as da
    import psutil
    from distributed import futures_of, wait

    import spillway
    from spillway.launch.plugins import worker_snapshot
    from spillway_bench.forcedbound import forced_moves
    from spillway_bench.measure import reset_peak, spill_moves
    from spillway_bench.workloads.expressions import complex_uniform

    t0 = time.perf_counter()
    with spillway.local() as cluster:
        client = cluster.client
        started = time.perf_counter() - t0
        device = sum(s["store"]["tiers"]["device"]["limit"] for s in client.run(worker_snapshot).values())
        # within the host's share, as the bench's O4 is (one H200 has less host than device)
        factor = min(factor, 1 + 0.75 * psutil.virtual_memory().total / device)
        n = n_given or int((factor * device / 2 / 16) ** 0.5) // 1000 * 1000
        samples = open(os.path.join(os.environ.get("OUT", "/tmp"), "o4-samples.jsonl"), "w")
        print(f"started in {started:.1f} s; device tier {device / GiB:.1f} GiB; n={n}, "
              f"footprint {2 * 16 * n * n / GiB:.1f} GiB", flush=True)
        for run in range(2):
            x = client.persist(complex_uniform((n, n), (5000, 5000), seed=11 + run, backend="cupy"))
            wait(futures_of(x))
            client.run(reset_peak)
            before = client.run(worker_snapshot)
            stop = threading.Event()
            sampler = threading.Thread(target=sampling, args=(client, samples, stop, run + 1), daemon=True)
            sampler.start()
            start = time.perf_counter()
            y = client.persist(da.fft.fft(x.rechunk({0: -1, 1: 1000}), axis=0))
            wait(futures_of(y))
            seconds = time.perf_counter() - start
            stop.set()
            sampler.join()
            samples.flush()
            after = client.run(worker_snapshot)
            moves = spill_moves(before, after)
            forced = forced_moves(before, after)
            gb = lambda b: f"{b / GiB:.1f}"  # noqa: E731
            parts = ", ".join(f"{m} {gb(moves['moves'][m]['bytes'])}/{gb(forced['moves'][m])}"
                              for m in forced["moves"])
            d2h = moves["moves"]["device_to_host"]
            host = moves["host_buffers"]
            stats = [s["store"]["stats"] for s in after.values()]
            old = [s["store"]["stats"] for s in before.values()]
            drained = sum(a["drained_bytes"] - b["drained_bytes"] for a, b in zip(stats, old))
            why = {w: sum(a.get(f"{w}_written_bytes", 0) - b.get(f"{w}_written_bytes", 0) for a, b in zip(stats, old))
                   for w in ("room", "limit", "needed")}
            clean = sum(a["clean_bytes"] - b["clean_bytes"] for a, b in zip(stats, old))
            rate = d2h["bytes"] / d2h["seconds"] / 1e9 if d2h["seconds"] else 0.0
            print(f"run {run + 1}: {seconds:.2f} s; moved/forced GiB: {parts}; peak {gb(forced['peak_bytes'])} GiB",
                  flush=True)
            print(f"  D->H {rate:.1f} GB/s over {d2h['seconds']:.2f} s, getting buffers {moves['spill_alloc_s']:.2f} s "
                  f"(room {host['room_s']:.2f} s, new {host['new_s']:.2f} s); buffers GiB "
                  + ", ".join(f"{k} {gb(v)}" for k, v in host["taken_from"].items())
                  + f"; drained {gb(drained)} GiB, clean re-spills {gb(clean)} GiB; restore wait "
                  f"{moves['restore_wait_s']:.2f} s", flush=True)
            print(f"  to disk GiB: drain {gb(drained)}, machine room {gb(why['room'])}, host limit "
                  f"{gb(why['limit'])}; of them a task here still waited for {gb(why['needed'])}", flush=True)
            rows = [json.loads(line) for line in open(samples.name) if f'"run": {run + 1},' in line]
            if rows:
                low = min(rows, key=lambda r: r["avail"])
                print("  least available: " + ", ".join(
                    f"{k} {gb(low[k])}" for k in ("avail", "rss", "held", "device", "host_tier", "clean", "arena",
                                                   "arena_used", "pageable", "kept", "pinned_od", "disk"))
                      + f" GiB ({len(rows)} samples)", flush=True)
            del x, y
            time.sleep(1)


def plot(samples: str, out: str) -> None:
    """The worker's host side over each run's time: what the host tier holds beside the
    arena's free slices, kept buffers and the rest of the worker, against the machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in map(json.loads, open(samples)) if r.get("t")]
    runs = sorted({r["run"] for r in rows})
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False, sharey=True)
    for ax, run in zip(axes[0], runs):
        these = [r for r in rows if r["run"] == run]
        t = [r["t"] - these[0]["t"] for r in these]
        for key, label in (("rss", "worker RSS"), ("host_tier", "host tier"), ("device", "device tier"),
                           ("disk", "disk"), ("kept", "kept pageable"), ("avail", "machine available")):
            ax.plot(t, [r[key] / GiB for r in these], label=label)
        ax.set_title(f"O4 run {run}")
        ax.set_xlabel("seconds")
    axes[0][0].set_ylabel("GiB")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__" and sys.argv[1:2] == ["--plot"]:
    plot(sys.argv[2], sys.argv[3])
elif __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "2.2"
    main(2.2, int(arg[1:])) if arg.startswith("n") else main(float(arg))
