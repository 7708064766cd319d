"""Run one registered workflow on a cluster session and report what it did.

The report is one JSON-able dict; :func:`~.text.format_report` renders it for people.
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from spillway import workflows
from spillway.workflows.outputs import remove_output, stored_bytes

from spillway.options.errors import OutputError, WorkerLost
from spillway.memory.capacity import disk_lines
from spillway.memory.admission import admit, cluster_capacity
from spillway.launch.plugins import reset_peak, worker_snapshot
from .progress import track, wait_with_bar
from spillway.datapath.transfer import transport
from spillway.launch.worker_loss import LossWatch
from .host import on_host
from .output import check_stored, wait_for_store
from .stats import transfer_stats
from .target import target_of
from .verify import check


def run_workflow(
    session,
    name: str,
    params: dict[str, Any] | None = None,
    *,
    verify: bool = False,
    progress=None,
    output: str | None = None,
    arrays: dict[str, Any] | None = None,
    verify_with=None,
    say=None,
) -> dict:
    """Run workflow ``name`` with raw ``params`` on ``session``; returns the report.

    ``progress`` is a text stream for the progress bar, or None for none. ``output`` is
    the path of a Zarr v3 store the workers write an array result to. ``arrays`` hands
    Python arrays to the workflow's array inputs (notebooks). ``verify_with(built, value)``
    makes the reference check (default :func:`~.verify.check`, in this process; a service
    passes a :class:`~.verify.ChildReference`). ``say(line)`` takes the line the scheduler
    sends when the run's graph goes past device + host tier (its disk traffic and time:
    :mod:`spillway.memory.capacity`); None prints it as any print at the client. The
    report keeps it too (``disk_traffic``).
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
        from spillway.options.errors import ParamError

        raise ParamError(f"output: {name} has no array result to write (its result is a summary)")
    if output is not None:
        outputs.check_space(output, int(built.array.nbytes))
    # whatever comes back to the client is a host value, converted on the worker by a final
    # task: a client process needs no device memory (nor a CUDA context) to read a result
    collections = [built.result]
    if output is not None:
        collections.append(outputs.zarr_store(built.array, output))
    # refused here, before anything is computed or allocated, if no tier can hold it
    decision = admit(name, built.footprint, capacity)

    # a worker the run depends on that dies fails it at once, naming the worker and why
    watch = LossWatch(client)
    said: list[str] = []
    try:
        with disk_lines(client, functools.partial(_heard, said, say)):
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
            "n_workers": target.n_workers,
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
        "disk_traffic": said,
    }
    report.update(transfer_stats(before, after, start_wall=time.time() - wall))
    # read on the workers: which UCX transports they really run with, not what was asked
    report["transport"] = transport(client)
    if verify:
        report["verify"] = (verify_with or check)(built, value)
    return report


def _heard(said: list, say, line: str) -> bool:
    """Keep the scheduler's disk-traffic line for the report; True where ``say`` took it
    (else the client prints it)."""
    said.append(line)
    if say is None:
        return False
    say(line)
    return True


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
                wait_for_store(futures[1], output)
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


def _run_on_workers(client, func):
    """``client.run(func)`` on the workers that answer: a worker lost (or restarting) is
    left out rather than failing the run before Dask can recompute its part."""
    return client.run(func, on_error="ignore")


def _protocol(client) -> str:
    return client.scheduler.address.split("://", 1)[0]
