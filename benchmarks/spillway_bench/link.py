"""``spillway bench --link-sweep``: the ceilings' link measurements at each message size
(peer copy both ways, UCXX send/receive between the first two GPUs, pinned copies; the
host copy on CPU workers), from which chunk size a transfer runs near the link's speed.
Files: ``<out>/<machine>-<date>-link[-<label>].{json,md,png}``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from spillway.options.errors import ParamError
from spillway.options.gpus import Inventory, discover
from spillway.launch import HostProbe
from spillway.launch import plan as launch_plan
from spillway.memory.growth import host_total
from spillway.options.settings import Options
from spillway.options.sizes import format_bytes, parse_size
from . import ceilings, report
from .formatting import columns, fmt_value, gpu_list, stack_line, stream_log

#: message sizes of the sweep unless ``--sweep-sizes`` names others
SWEEP_SIZES = tuple(n * 2**20 for n in (8, 32, 128, 256, 512, 1024, 2048))
#: what is measured at each size, by the workers' kind, in the order shown
MEASURES = {
    "gpu": ("peer_copy_0_to_1", "peer_copy_1_to_0", "ucxx_send_recv", "h2d_pinned", "d2h_pinned"),
    # workers sharing one GPU (workers-per-gpu): a copy within it instead of a peer copy,
    # and UCXX between two processes on it
    "shared-gpu": ("same_gpu_copy", "ucxx_send_recv", "h2d_pinned", "d2h_pinned"),
    "cpu": ("host_copy",),
}


def measured_kind(kind: str, devices: tuple) -> str:
    """The key of :data:`MEASURES` for workers of ``kind`` on ``devices`` (a GPU named
    once per worker): ``shared-gpu`` where every worker shares one GPU."""
    return "shared-gpu" if kind == "gpu" and len(devices) > 1 and len(set(devices)) == 1 else kind
#: below a page a copy measures call overhead, not the link
MIN_SIZE = 4096
MAX_SIZES = 16
#: share of the smallest GPU (and of the host) the largest message may take twice over:
#: the device probe holds a source and a destination buffer at once
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class LinkSweep:
    kind: str
    devices: tuple
    inventory: Inventory | None
    sizes: tuple[int, ...]
    label: str | None = None


def parse_sizes(text: str | None) -> tuple[int, ...]:
    """``1MB,4MB`` as bytes, smallest first; None gives :data:`SWEEP_SIZES`."""
    if text is None:
        return SWEEP_SIZES
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise ParamError(f"sweep-sizes: {text!r} names no size; give sizes such as 8MiB,1GiB")
    if len(items) > MAX_SIZES:
        raise ParamError(f"sweep-sizes: {len(items)} sizes given, more than the limit of {MAX_SIZES}")
    try:
        sizes = {parse_size(item, name="sweep-sizes", minimum=MIN_SIZE) for item in items}
    except ValueError as e:
        raise ParamError(str(e)) from None
    return tuple(sorted(sizes))


def prepare_sweep(options: Options, *, sizes: str | None = None, label: str | None = None,
                  inventory: Inventory | None = None) -> LinkSweep:
    """Check the request and fix the sweep; one-line errors before any buffer is taken."""
    label = report.check_label(label)
    parsed = parse_sizes(sizes)
    if options.attach:
        raise ParamError("scheduler-address/scheduler-file: the link sweep measures this machine, it cannot attach")
    inventory = discover() if inventory is None else inventory
    launch = launch_plan(options, inventory, HostProbe.here())
    largest = parsed[-1]
    host = host_total()
    if 2 * largest > MEMORY_SHARE * host:
        raise ParamError(f"sweep-sizes: {format_bytes(largest)} needs {format_bytes(2 * largest)} of host "
                         f"memory, more than half of this machine's {format_bytes(host)}")
    if launch.kind == "gpu":
        memory = launch.device_memory
        if memory and 2 * largest > MEMORY_SHARE * min(memory):
            raise ParamError(f"sweep-sizes: {format_bytes(largest)} needs {format_bytes(2 * largest)} on one GPU, "
                             f"more than half of its {format_bytes(min(memory))}")
    return LinkSweep(kind=launch.kind, devices=tuple(launch.devices), inventory=inventory, sizes=parsed,
                     label=label)


def measure_at(kind: str, devices: tuple, nbytes: int, *, timeout: float = 300) -> tuple[dict, dict]:
    """GB/s by name at one message size, and why any of :data:`MEASURES` was not measured."""
    if kind == "cpu":
        return {"host_copy": ceilings.host_copy_gbps(nbytes)}, {}
    gbps, skipped = ceilings.gpu_ceilings(devices, nbytes, timeout=timeout)
    if "peer_copy" in skipped:  # the probe names the pair, the sweep each direction
        for name in ("peer_copy_0_to_1", "peer_copy_1_to_0"):
            skipped.setdefault(name, skipped["peer_copy"])
    return gbps, skipped


def sweep(link_sweep: LinkSweep, *, log: Callable[[str], None] = lambda _: None,
          measure: Callable = measure_at) -> dict:
    """Every measurement at every size: ``gbps`` (a list per name, None where not
    measured) and ``skipped`` (per name, the reason by size)."""
    names = MEASURES[measured_kind(link_sweep.kind, link_sweep.devices)]
    gbps = {name: [] for name in names}
    skipped: dict[str, dict[str, str]] = {}
    for nbytes in link_sweep.sizes:
        found, why = measure(link_sweep.kind, link_sweep.devices, nbytes)
        for name in names:
            value = found.get(name)
            gbps[name].append(value)
            if value is None:
                skipped.setdefault(name, {})[str(nbytes)] = why.get(name, "not measured")
        log(f"link {format_bytes(nbytes):>10}  " + "  ".join(
            f"{name} {fmt_value(gbps[name][-1], '{:.1f}')}" for name in names))
    return {"gbps": gbps, "skipped": skipped}


def run_sweep(link_sweep: LinkSweep, out_dir: Path, *, stream=sys.stderr,
              measure: Callable = measure_at) -> tuple[dict, dict[str, Path]]:
    """Measure, then write the JSON, markdown and plot; returns the results and paths."""
    machine = report.describe_machine(link_sweep.inventory, link_sweep.kind)
    started = datetime.now(timezone.utc)

    log = stream_log(stream)
    names = MEASURES[measured_kind(link_sweep.kind, link_sweep.devices)]
    log(f"spillway bench --link-sweep on {machine['name']}: {', '.join(names)} "
        f"at {', '.join(format_bytes(n) for n in link_sweep.sizes)}")
    measured = sweep(link_sweep, log=log, measure=measure)
    results = {
        "what": "link sweep",
        "machine": machine,
        "label": link_sweep.label,
        "workers": link_sweep.kind,
        "devices": [str(d) for d in ceilings.physical(link_sweep.devices)],
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "message_bytes": list(link_sweep.sizes),
        **measured,
    }
    name = report.stem(machine, started, "link" + (f"-{link_sweep.label}" if link_sweep.label else ""))
    paths = report.write(results, out_dir, name, render=markdown, draw=plot)
    for path in paths.values():
        log(f"wrote {path}")
    return results, paths


# --- rendering


def _rows(results: dict) -> list[list[str]]:
    names = list(results["gbps"])
    rows = [["message", *names]]
    for i, nbytes in enumerate(results["message_bytes"]):
        rows.append([format_bytes(nbytes),
                     *(fmt_value(results["gbps"][n][i], "{:.1f}") for n in names)])
    return rows


def short_table(results: dict) -> str:
    """GB/s by message size, printed last on the terminal."""
    return columns(_rows(results))


def markdown(results: dict) -> str:
    m = results["machine"]
    gpus = gpu_list(m)
    rows = _rows(results)
    lines = [
        f"# spillway bench --link-sweep: {m['name']}",
        "",
        f"- started {results['started']}, finished {results['finished']}",
        *([f"- label `{results['label']}`"] if results.get("label") else []),
        f"- workers: {results['workers']}; devices {', '.join(results['devices']) or 'none'}; GPUs: {gpus}; "
        f"driver {m['driver_version']}, CUDA {m['cuda_driver_version']}",
        stack_line(m),
        "",
        "GB/s (10^9 bytes per second) by message size.",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "| --- |" + " ---: |" * (len(rows[0]) - 1),
        *("| " + " | ".join(r) + " |" for r in rows[1:]),
    ]
    notes = [f"- {name} at {format_bytes(int(size))}: {why}"
             for name, by_size in results["skipped"].items() for size, why in by_size.items()]
    if notes:
        lines += ["", "## Not measured", "", *notes]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = results["message_bytes"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, values in results["gbps"].items():
        points = [(s, v) for s, v in zip(sizes, values) if v is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [format_bytes(s) for s in sizes], rotation=30)
    ax.minorticks_off()
    ax.set_xlabel("message size")
    ax.set_ylabel("GB/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"link sweep on {results['machine']['name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
