"""What ``spillway info`` reports: GPUs, links, driver, and the installed GPU stack."""

from __future__ import annotations

from spillway.options.gpus import discover, topology_lines
from spillway.options.sizes import format_bytes
from spillway.options.stack import installed_stack

def collect() -> dict:
    inv = discover()
    return {
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "memory_total": g.memory_total,
                "memory_free": g.memory_free,
                "pci_bus_id": g.pci_bus_id,
                **g.links_json(),
            }
            for g in inv.gpus
        ],
        "driver_version": inv.driver_version,
        "cuda_driver_version": inv.cuda_driver_version,
        "no_gpu_reason": inv.reason,
        "stack": installed_stack(),
        "transport": planned_transport(inv),
    }


def zarr_io_line(stack: dict, has_gpus: bool) -> str | None:
    """How GPU workers here read and write Zarr chunks (from what is installed; the
    bench's results say what the workers really ran: GDS or KvikIO's POSIX mode)."""
    if not has_gpus:
        return None
    if stack.get("kvikio"):
        return (f"zarr chunks on GPU workers: KvikIO {stack['kvikio']} (whole chunk files to and from device "
                "memory; GDS where the filesystem has it, else POSIX with KvikIO's threads)")
    return ("zarr chunks on GPU workers: read on the host and copied (kvikio missing: install spillway[cuda13] "
            "or [cuda12] for reads straight into device memory)")


def planned_transport(inventory) -> str:
    """The transport between workers of the cluster the configured options start here
    (``spillway run`` reports the one the running workers really use)."""
    import os

    from spillway.options.errors import OptionsError
    from spillway.launch import HostProbe, plan
    from spillway.options.settings import Options
    from spillway.datapath.transfer import planned

    try:
        options = Options.resolve()
        launch = plan(options, inventory, HostProbe.here())
    except OptionsError as e:
        return f"unknown ({e})"
    if launch.kind == "attach":
        return "that of the running cluster (see spillway run)"
    if launch.kind != "gpu" or launch.n_workers < 2:
        return launch.protocol if launch.n_workers >= 2 else f"{launch.protocol} (one worker: no transfers)"
    for note in launch.notes:  # why it is TCP, where UCX would have been the better choice
        if note.startswith("protocol:"):
            return f"{planned(launch.protocol, options.nvlink, {}, launch.devices)}: {note[len('protocol: '):]}"
    env = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    return planned(launch.protocol, options.nvlink, env, launch.devices)


def format_info(data: dict) -> str:
    lines = []
    if not data["gpus"]:
        lines.append(f"GPUs: none ({data['no_gpu_reason']}); spillway runs on CPU workers")
    else:
        lines.append(f"driver {data['driver_version']}, CUDA {data['cuda_driver_version']}")
        for g in data["gpus"]:
            lines.append(
                f"GPU {g['index']}: {g['name']}, {format_bytes(g['memory_total'])} "
                f"({format_bytes(g['memory_free'])} free), {g['uuid']}, bus {g['pci_bus_id']}"
            )
        lines += topology_lines(data["gpus"])
    if data.get("transport"):
        lines.append(f"transport between workers: {data['transport']}")
    zarr_line = zarr_io_line(data["stack"], bool(data["gpus"]))
    if zarr_line:
        lines.append(zarr_line)
    lines.append("stack: " + ", ".join(f"{k} {v or 'missing'}" for k, v in data["stack"].items()))
    return "\n".join(lines)
