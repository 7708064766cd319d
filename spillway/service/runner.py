"""Run one registered workflow on a cluster session and report what it did.

validate (a size the cluster cannot hold is refused first, in bytes) -> build (lazy) -> project
the footprint and admit -> compute with progress -> verify -> report. The report is one
JSON-able dict; :func:`format_report` renders it for people.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections import Counter
from typing import Any

from spillway import workflows
from spillway.workflows.params import Target
from spillway.workflows.outputs import remove_output, stored_bytes
from spillway.workflows.registry import relative_error

from .errors import OutputError, WorkerLost
from .memory.admission import admit, cluster_capacity
from .plugins import reset_peak, worker_snapshot
from .progress import track, wait_with_bar
from .sizes import format_bytes
from .transfer import transport, worker_gpu
from .worker_loss import LossWatch


def target_of(session) -> Target:
    """The workflow target of a running cluster: worker kind, count and memory each."""
    info = session.client.scheduler_info(n_workers=-1)["workers"]
    limits = [w.get("memory_limit") or 0 for w in info.values()]
    if session.kind == "gpu":
        device = session.client.run(_device_limit)
        # a worker without a device limit has its GPU, shared with the other workers of it
        sharing = Counter(d["gpu"] for d in device.values())
        limits = [d["limit"] // (sharing[d["gpu"]] if d["whole_gpu"] and d["gpu"] else 1)
                  for d in device.values() if d["limit"]] or limits
    per_worker = min(limits) if limits and min(limits) > 0 else 4 * 2**30
    return Target(kind=session.kind, n_workers=session.n_workers, worker_bytes=int(per_worker),
                  workers=tuple(sorted(info)))


def _device_limit(dask_worker):
    """The worker's device limit (its store's), else its whole GPU, and which GPU it is
    (runs on the worker)."""
    from .gpus import discover
    from .memory.admission import worker_capacity

    device = worker_capacity(dask_worker)["device"]
    if device:
        return {"limit": device, "gpu": worker_gpu(), "whole_gpu": False}
    inventory = discover()  # honours CUDA_VISIBLE_DEVICES: GPU 0 is this worker's
    return {"limit": inventory.gpus[0].memory_total if len(inventory) else None, "gpu": worker_gpu(),
            "whole_gpu": True}


def run_workflow(
    session,
    name: str,
    params: dict[str, Any] | None = None,
    *,
    verify: bool = False,
    progress=None,
    output: str | None = None,
    arrays: dict[str, Any] | None = None,
) -> dict:
    """Run workflow ``name`` with raw ``params`` on ``session``; returns the report.

    ``progress`` is a text stream for the progress bar, or None for none. ``output`` is
    the path of a Zarr v3 store the workers write an array result to. ``arrays`` hands
    Python arrays to the workflow's array inputs (notebooks).
    """
    from spillway.workflows import outputs

    workflow = workflows.get(name)
    if output is not None:
        output = outputs.check_path(output)
    target = target_of(session)
    client = session.client
    capacity = cluster_capacity(client)
    # a size the cluster cannot hold is refused for that, in bytes, before any other check
    # of the parameters (too many chunks of it, say) can speak first
    validated, built = workflow.build_run(params, target, arrays, fits=lambda floor: admit(name, floor, capacity))
    if output is not None and built.array is None:
        from .errors import ParamError

        raise ParamError(f"output: {name} has no array result to write (its result is a summary)")
    # whatever comes back to the client is a host value, converted on the worker by a final
    # task: a client process needs no device memory (nor a CUDA context) to read a result
    collections = [built.result]
    if output is not None:
        collections.append(outputs.zarr_store(built.array, output))
    # refused here, before anything is computed or allocated, if no tier can hold it
    decision = admit(name, built.footprint, capacity)

    # a worker the run depends on that dies fails it at once, naming the worker and why
    watch = LossWatch(client)
    try:
        value, counts, wall, before, after, written, readback = _compute(
            client, name, built, collections, output, progress, watch)
    except BaseException:
        if output is not None:
            remove_output(output)  # a partial store is never left to look like a result
        raise
    finally:
        watch.stop()
    # workers that left without taking anything of the run
    lost = watch.harmless

    report: dict[str, Any] = {
        "workflow": name,
        "params": validated.to_json(),
        "wall_s": wall,
        "result": built.summarize(value),
        "verify": None,
        "cluster": {
            "kind": session.kind,
            "n_workers": session.n_workers,
            "protocol": session.plan.protocol if session.plan.kind != "attach" else _protocol(client),
            # only where spillway planned GPU workers: attached clusters keep their own
            **({"workers_per_gpu": session.plan.workers_per_gpu} if session.plan.kind == "gpu" else {}),
        },
        "footprint": built.footprint.to_json(),
        "admission": decision.to_json(),
        "tasks": counts.get("total", 0),
        "bytes_produced": counts.get("bytes", 0),
        "bytes_read": built.bytes_read,
        "bytes_written": written,
        "output": output,
        "output_check": readback if output is not None else None,
        "workers_lost": lost,
    }
    report.update(transfer_stats(before, after, start_wall=time.time() - wall))
    # read on the workers: which UCX transports they really run with, not what was asked
    report["transport"] = transport(client)
    if verify:
        report["verify"] = check(built, value)
    return report


def _compute(client, name, built, collections, output, progress, watch):
    """Compute the run's graph; every future awaited, the output measured and read back."""
    _run_on_workers(client, reset_peak)
    before = _run_on_workers(client, worker_snapshot)
    run_id = f"{name}-{uuid.uuid4().hex[:8]}"
    start = time.perf_counter()
    try:
        with track(client, run_id) as tracker:
            # one graph, so an array result is computed once for the summary and the store
            computed = client.compute(collections, optimize_graph=built.optimize_graph)
            # the computed futures stay held: the run's progress is found through them
            futures = [on_host(client, f) for f in computed]
            watch.follow([*computed, *futures])
            counts = wait_with_bar(futures, tracker, label=name, stream=progress)
            # every future is awaited: a store task that failed fails the run
            if output is not None:
                _written(futures[1], output)
            value = client.gather(futures[0])
    except OutputError:
        raise
    except Exception:
        # the loss first: Dask's own error (a task cancelled, KilledWorker) says less
        if watch.settle():
            raise WorkerLost(watch.error) from None
        raise
    wall = time.perf_counter() - start
    after = _run_on_workers(client, worker_snapshot)
    del futures, computed
    written, readback = 0, None
    if output is not None:
        written = stored_bytes(output)
        readback = check_stored(client, built, value, output)

    return value, counts, wall, before, after, written, readback


# --- host values


def to_host(value):
    """``value`` with every device array in it (CuPy, or anything with
    ``__cuda_array_interface__``) copied to a NumPy array; tuples, lists and dicts are
    walked. Runs on the worker, as the last task of what the client gathers."""
    if isinstance(value, tuple):
        return tuple(to_host(v) for v in value)
    if isinstance(value, list):
        return [to_host(v) for v in value]
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if type(value).__module__.startswith("cupy") or hasattr(value, "__cuda_array_interface__"):
        get = getattr(value, "get", None)
        if callable(get):
            return get()
        import cupy

        return cupy.asnumpy(value)
    return value


#: key prefix of the tasks that bring results to the host
HOST_TASK = "spillway-to-host"


def on_host(client, future):
    """A future of ``future``'s value brought to the host by :func:`to_host`, on the worker
    that holds it. Submitted after the graph rather than wrapped around it (a delayed over
    the collection): that would rebuild the graph and drop the layers' annotations, such
    as where each generated chunk is placed."""
    return client.submit(to_host, future, key=f"{HOST_TASK}-{uuid.uuid4().hex}", pure=False)


# --- outputs: written, measured and read back


def _written(future, path: str) -> None:
    """Wait for the store future; a failed write removes what was written and fails the run."""
    try:
        future.result()
    except Exception as e:  # noqa: BLE001 (named in the one line)
        remove_output(path)
        raise OutputError(f"output: writing {path} failed: {_os_error(e)}; the partial store was removed") from e


def _os_error(e: BaseException) -> str:
    """The OS error under ``e`` (``[Errno 28] No space left on device``), else its line."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return f"[Errno {seen.errno}] {seen.strerror}"
        seen = seen.__cause__ or seen.__context__
    return f"{type(e).__name__}: {_first_line(e)}"


def check_stored(client, built, value, path: str) -> dict:
    """Read the store back on the workers and compare its float64 checksum with the one of
    the computed result: a store that holds other values (chunks lost, zeros) fails the
    run with :class:`OutputError`, and is removed."""
    import numpy as np

    from spillway.workflows.zarr.read import open_array

    summary = built.summarize(value)
    expected = summary.get("checksum")
    stored = open_array(path, "numpy")
    complex_result = np.issubdtype(stored.dtype, np.complexfloating)
    acc = np.complex128 if complex_result else np.float64
    sums = client.compute([stored.sum(dtype=acc), abs(stored).sum(dtype=np.float64)])
    total, scale = client.gather([on_host(client, f) for f in sums])
    total = complex(total) if complex_result else float(total)
    want = complex(*expected) if isinstance(expected, list) else expected
    # the sums differ only by the order of additions
    ok = want is not None and abs(total - want) <= 1e-9 * max(float(scale), 1.0)
    if not ok:
        remove_output(path)
        raise OutputError(f"output: {path} reads back a checksum of {total!r}, not the result's {want!r}; "
                          "the store was removed")
    return {"ok": True, "checksum": [total.real, total.imag] if complex_result else total}


# --- workers lost during a run


def _run_on_workers(client, func):
    """``client.run(func)`` on the workers that answer: a worker lost (or restarting) is
    left out rather than failing the run before Dask can recompute its part."""
    return client.run(func, on_error="ignore")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check(built, value) -> dict:
    if built.reference is None:
        return {"rel_error": None, "tolerance": built.tolerance, "ok": None, "reference": "none"}
    t0 = time.perf_counter()
    expected, how = built.reference(value)
    err = relative_error(built.checked(value), expected)
    return {
        "rel_error": err,
        "tolerance": built.tolerance,
        "ok": bool(err <= built.tolerance),
        "reference": how,
        "reference_s": time.perf_counter() - t0,
    }


def _protocol(client) -> str:
    return client.scheduler.address.split("://", 1)[0]


def transfer_stats(before: dict, after: dict, *, start_wall: float) -> dict:
    """Bytes moved between workers, bytes spilled and peak memory, from two snapshots."""
    transferred = 0
    bandwidths = []
    for addr, snap in after.items():
        for t in snap["transfers"]:
            if t["start"] >= start_wall - 1e-3:
                transferred += t["bytes"]
                if t["bytes"] > 1_000_000:
                    bandwidths.append(t["bytes"] / max(1e-6, t["stop"] - t["start"]))
    spilled: dict[str, int] = {}
    spill_per_worker = {}
    for addr, snap in after.items():
        old = before.get(addr, {}).get("spilled", {})
        for tier, nbytes in snap["spilled"].items():
            spilled[tier] = spilled.get(tier, 0) + nbytes - old.get(tier, 0)
        if snap.get("store"):
            spill_per_worker[addr] = _store_delta(before.get(addr, {}).get("store"), snap["store"])
    out = {
        "bytes_transferred": transferred,
        "transfer_gbps_median": statistics.median(bandwidths) / 1e9 if bandwidths else None,
        "bytes_spilled": sum(spilled.get(t, 0) for t in ("device_to_host", "host_to_disk")),
        "spilled_by_tier": spilled,
        "peak_bytes_per_worker": {addr: snap["peak_bytes"] for addr, snap in after.items()},
        "memory_measure": next(iter(after.values()))["memory_measure"] if after else None,
        # each worker process's resident host memory at its highest during the run
        "peak_host_bytes_per_worker": {addr: snap.get("host_peak_bytes") for addr, snap in after.items()},
        "spill": spill_per_worker or None,
    }
    return out


def _store_delta(before: dict | None, after: dict) -> dict:
    """Per-move bytes, seconds and GB/s of one worker's tiered store during the run."""
    old = (before or {}).get("stats") or {"bytes": {}, "seconds": {}, "wait_s": 0.0, "prefetched_bytes": 0,
                                          "ondemand_events": 0, "ondemand_bytes": 0}
    new = after["stats"]
    moves = {}
    for move, nbytes in new["bytes"].items():
        b = nbytes - old["bytes"].get(move, 0)
        sec = new["seconds"][move] - old["seconds"].get(move, 0.0)
        moves[move] = {"bytes": b, "seconds": sec, "gbps": b / sec / 1e9 if sec > 0 else None}
    return {
        "moves": moves,
        "wait_s": new["wait_s"] - old["wait_s"],
        "prefetched_bytes": new["prefetched_bytes"] - old["prefetched_bytes"],
        "ondemand_events": new["ondemand_events"] - old["ondemand_events"],
        "ondemand_bytes": new["ondemand_bytes"] - old["ondemand_bytes"],
        "resident": {k: after[k] for k in ("device_bytes", "host_bytes", "disk_bytes")},
        "host_memory": _host_memory(before, after),
    }


def _host_memory(before: dict | None, after: dict) -> dict | None:
    """What the machine said of the worker's host memory during the run (the lowest
    available its books saw, reset with the run's window), and the time it was paused
    for it; the process's peak is ``peak_host_bytes_per_worker``."""
    books = after.get("books")
    if not books:
        return None
    pause, old = after.get("host_pause") or {}, (before or {}).get("host_pause") or {}
    return {
        "lowest_available_bytes": books["lowest_available_bytes"],
        "other_bytes": books["other_bytes"],
        "headroom_bytes": books["headroom_bytes"],
        "short_events": books["short_events"] - ((before or {}).get("books") or {}).get("short_events", 0),
        "pauses": pause.get("pauses", 0) - old.get("pauses", 0),
        "paused_s": pause.get("paused_s", 0.0) - old.get("paused_s", 0.0),
    }


def format_report(report: dict) -> str:
    """The report as aligned lines for a terminal."""
    per_gpu = report["cluster"].get("workers_per_gpu") or 1
    lines = [f"workflow      {report['workflow']}  ({report['cluster']['kind']}, "
             f"{report['cluster']['n_workers']} workers{f' ({per_gpu} per GPU)' if per_gpu > 1 else ''}, "
             f"{report['cluster']['protocol']})"]
    params = ", ".join(f"{k}={_fmt(v)}" for k, v in report["params"].items())
    lines.append(f"params        {params}")
    result = ", ".join(f"{k}={_fmt(v)}" for k, v in report["result"].items())
    lines.append(f"result        {result}")
    lines.append(f"wall time     {report['wall_s']:.3f} s  ({report['tasks']} tasks)")
    fp = report["footprint"]
    lines.append(f"input         {format_bytes(fp['input_bytes'])}  "
                 f"(projected peak {format_bytes(fp['per_worker_bytes'])} per worker)")
    lines.append(f"read/written  {format_bytes(report.get('bytes_read', 0))} read, "
                 f"{format_bytes(report.get('bytes_written', 0))} written"
                 + (f" to {report['output']}" if report.get("output") else ""))
    bw = report.get("transfer_gbps_median")
    lines.append(f"transferred   {format_bytes(report['bytes_transferred'])} between workers"
                 + (f"  (median {bw:.1f} GB/s)" if bw else "")
                 + (f" over {report['transport']}" if report.get("transport") else ""))
    lines.append(f"spilled       {format_bytes(report['bytes_spilled'])}")
    for addr, spill in (report.get("spill") or {}).items():
        parts = [f"{m.replace('_to_', '->')} {format_bytes(v['bytes'])}"
                 + (f" at {v['gbps']:.1f} GB/s" if v["gbps"] else "")
                 for m, v in spill["moves"].items() if v["bytes"]]
        if parts:
            lines.append(f"  {addr}: " + ", ".join(parts) + f"; tasks waited {spill['wait_s']:.3f} s")
    peaks = report["peak_bytes_per_worker"]
    if peaks:
        shown = ", ".join(format_bytes(v) for v in peaks.values() if v is not None)
        lines.append(f"peak memory   {shown}  ({report.get('memory_measure')})")
    host = [v for v in (report.get("peak_host_bytes_per_worker") or {}).values() if v is not None]
    if host and report.get("memory_measure") == "rmm":
        lines.append(f"peak host     {', '.join(format_bytes(v) for v in host)}  (worker RSS)")
    for addr, spill in (report.get("spill") or {}).items():
        host = spill.get("host_memory")
        if host and host["lowest_available_bytes"] is not None:
            lines.append(f"host memory   {addr}: machine available >= {format_bytes(host['lowest_available_bytes'])} "
                         f"(headroom {format_bytes(host['headroom_bytes'])})"
                         + (f"; paused {host['pauses']}x, {host['paused_s']:.1f} s" if host["pauses"] else ""))
    v = report.get("verify")
    if v:
        status = "OK" if v["ok"] else "FAILED"
        lines.append(f"verify        {status}: relative error {v['rel_error']:.3e} "
                     f"(tolerance {v['tolerance']:.0e}, reference: {v['reference']})")
    return "\n".join(lines)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "x".join(map(str, v))
    return str(v)
