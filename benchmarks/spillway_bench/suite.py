"""The bench's one entry: :func:`prepare` fixes everything before memory is taken
(workloads, sizes, the launch plan, whether the inputs fit); :func:`run_bench` measures the
ceilings, runs every workload on its sides' clusters, compares the results with the
previous result of the machine (:mod:`.previous`) and writes them."""


from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

from spillway.options.errors import ParamError
from spillway.options.gpus import Inventory, discover
from spillway.launch import HostProbe
from spillway.launch import plan as launch_plan
from spillway.launch import plan_when_free
from spillway.options.settings import Options
from . import ceilings, previous, report
from .clusters import bench_options
from .harness import BenchRun, check_fits, run
from .workloads import SCALES, WORKLOADS, select

#: share of worker memory the persisted inputs of one workload may take
INPUT_SHARE = {"cpu": 0.4, "gpu": 1.5}


def prepare(options: Options, *, only: str | None = None, sizes: str = "auto", runs: int = 3,
            timeout: float = 900, inventory: Inventory | None = None,
            merge_into: str | Path | None = None, baseline: bool = True, label: str | None = None,
            previous: str | Path | None = None) -> BenchRun:
    """Check the request and fix the run; raises one-line errors before anything starts.

    ``options`` are the user's; the bench's own settings for speed are added here where
    the user left a value unset (:func:`~spillway_bench.clusters.bench_options`).
    ``baseline=False`` measures spillway's side alone; ``label`` names the run in its
    results and file names; ``previous``: the results file, or directory, the run is
    compared with (:mod:`.previous`; the output directory where None).
    """
    label, inventory, launch, options, scale = checked_launch(
        options, sizes=sizes, runs=runs, label=label, inventory=inventory,
        no_attach="bench starts its own clusters")
    gpu_workers = launch.n_workers if launch.kind == "gpu" else 0
    # B4, B5, O3 and O4 are sized at full size from the memory of the run's GPUs and how
    # many there are (none on CPU workers)
    gpus = len(launch.gpus) if launch.kind == "gpu" else 0
    host = _host_bytes() if launch.kind == "gpu" else None
    workloads = [w.for_machine(sum(launch.device_memory) or None, gpu_workers, gpus, host) for w in select(only)]
    check_fits(workloads, scale, launch.kind, budget(launch))
    machine = report.describe_machine(inventory, launch.kind)["name"]
    earlier = None
    if merge_into is not None:
        earlier = _earlier(Path(merge_into), machine, scale, runs)
    if previous is not None:
        _check_previous(Path(previous), machine)
    return BenchRun(options=options, launch=launch, inventory=inventory, workloads=workloads,
                scale=scale, runs=runs, timeout=timeout, merge_into=earlier,
                merge_path=Path(merge_into) if merge_into is not None else None,
                baseline=baseline, label=label, previous=Path(previous) if previous is not None else None)


def _check_previous(path: Path, machine: str) -> None:
    """A ``previous`` named by hand: a directory, or a bench results file of this machine."""
    import json

    from .previous import is_bench_result

    if path.is_dir():
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ParamError(f"previous: {str(path)!r} is neither a directory nor a results file ({e})") from None
    if not is_bench_result(data):
        raise ParamError(f"previous: {str(path)!r} is not a spillway bench results file")
    if data["machine"]["name"] != machine:
        raise ParamError(f"previous: {str(path)!r} holds {data['machine']['name']}; this run is {machine}")


def checked_launch(options: Options, *, sizes: str, runs: int, label: str | None,
                   inventory: Inventory | None, no_attach: str, scales=SCALES) -> tuple:
    """What every bench mode checks first: the label, the number of runs, no attaching
    (``no_attach`` says why), the launch plan with the bench's settings and the size
    scale. Returns ``(label, inventory, launch, options, scale)``."""
    label = report.check_label(label)
    if runs < 3:
        raise ParamError(f"runs: {runs} is below the minimum of 3 timed runs")
    if options.attach:
        raise ParamError(f"scheduler-address/scheduler-file: {no_attach}, it cannot attach")
    if inventory is None:
        # the GPUs as soon as the previous cluster gave them back (its workers' pools go
        # back seconds after it closed: a study's next size starts right away)
        launch = plan_when_free(options, HostProbe.here())
        inventory = discover()
    else:
        launch = launch_plan(options, inventory, HostProbe.here())
    options = bench_options(options, launch.kind)
    scale = sizes if sizes != "auto" else ("small" if launch.kind == "gpu" else "tiny")
    if scale not in scales:
        raise ParamError(f"sizes: {sizes!r} is not one of auto, {', '.join(scales)}")
    return label, inventory, launch, options, scale


def _earlier(path: Path, machine: str, scale: str, runs: int) -> dict:
    """An earlier results file that this run may add to: same machine, sizes and runs."""
    import json

    try:
        data = json.loads(path.read_text())
        found = (data["machine"]["name"], data["sizes"], data["runs"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ParamError(f"merge-into: {str(path)!r} is not a spillway bench results file ({e})") from None
    if found != (machine, scale, runs):
        raise ParamError(
            f"merge-into: {str(path)!r} holds {found[0]} at {found[1]} sizes with {found[2]} runs; "
            f"this run is {machine} at {scale} sizes with {runs} runs"
        )
    return data


def against_previous(results: dict, where: Path, *, exclude: tuple[Path, ...] = ()) -> dict:
    """``previous``, ``slower`` and ``new`` of ``results`` against the earlier results of
    its machine in ``where`` (:mod:`.previous`)."""
    earlier, committed = previous.earlier_results(where, results["machine"]["name"], exclude=exclude)
    return previous.compare(results, earlier, committed_only=committed, where=where)


def _host_bytes() -> int:
    import psutil

    return psutil.virtual_memory().total


def budget(launch) -> int:
    host = _host_bytes()
    if launch.kind == "gpu":
        device = sum(launch.device_memory)
        # device memory plus the host memory spilling may use
        return int(INPUT_SHARE["gpu"] * device + 0.5 * host)
    return int(INPUT_SHARE["cpu"] * host)


def run_bench(bench_run: BenchRun, out_dir: Path, *, stream=sys.stderr,
              measure_ceilings=ceilings.measure) -> tuple[dict, dict[str, Path]]:
    """Run the benchmark; returns the results and the paths written."""
    machine = report.describe_machine(bench_run.inventory, bench_run.launch.kind)
    started = datetime.now(timezone.utc)
    name = report.stem(machine, started, bench_run.label)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"{name}.log"
    # progress and spillway's own records in one handler; the libraries' in another,
    # since distributed lowers the level of every handler on its logger to WARNING
    handlers = {}
    for group in ("own", "libraries"):
        handlers[group] = logging.FileHandler(log_path)
        handlers[group].setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    attached = [(logging.getLogger("spillway"), handlers["own"])]
    attached += [(logging.getLogger(n), handlers["libraries"]) for n in ("distributed", "dask_cuda", "ucxx")]
    progress = logging.getLogger("spillway_bench.progress")
    progress.setLevel(logging.INFO)
    progress.propagate = False  # printed to ``stream`` below; the log file gets it here
    attached.append((progress, handlers["own"]))
    for lg, h in attached:
        lg.addHandler(h)

    def log(message: str) -> None:
        progress.info(message)
        if stream is not None:
            print(message, file=stream, flush=True)

    try:
        log(f"spillway bench on {machine['name']}: {', '.join(w.name for w in bench_run.workloads)} "
            f"at {bench_run.scale} sizes, {bench_run.runs} timed runs each; log in {log_path}")
        if bench_run.merge_into is not None:
            # one machine, one set of ceilings: the earlier file's
            old = bench_run.merge_into
            ceiling = ceilings.Ceilings(gbps=dict(old["ceilings"]), skipped=dict(old["ceilings_skipped"]),
                                        nbytes=old["ceiling_bytes"])
            log(f"adding to {bench_run.merge_path}; its ceilings are used")
        else:
            chunk = max(w.chunk_bytes(bench_run.scale) for w in bench_run.workloads)
            # the disk ceilings in the directory the workers spill to
            ceiling = measure_ceilings(bench_run.launch.kind, bench_run.launch.devices, chunk, log=log,
                                       directory=bench_run.options.local_directory)
        outcome = run(bench_run, log=log)
        results = report.build_results(
            machine=machine, ceilings=ceiling, bench_run=bench_run, outcome=outcome,
            started=started.isoformat(timespec="seconds"),
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        if bench_run.merge_into is not None:
            results = report.merge(bench_run.merge_into, results, kind=bench_run.launch.kind,
                                   order=list(WORKLOADS))
            target = (bench_run.merge_path.parent, bench_run.merge_path.stem)
        else:
            target = (out_dir, name)
        results.update(against_previous(results, bench_run.previous or target[0],
                                        exclude=(target[0] / f"{target[1]}.json",)))
        for line in previous.lines(results):
            progress.info(line)  # the log file's; the command prints them last
        paths = report.write(results, *target)
        paths["log"] = log_path
        for kind, path in paths.items():
            log(f"wrote {path}")
        return results, paths
    finally:
        for lg, h in attached:
            lg.removeHandler(h)
        for h in handlers.values():
            h.close()
