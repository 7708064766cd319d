"""The run report as aligned lines for a terminal."""

from __future__ import annotations

from spillway.options.sizes import format_bytes


def format_report(report: dict) -> str:
    """The report as aligned lines for a terminal."""
    per_gpu = report["cluster"].get("workers_per_gpu") or 1
    lines = [f"workflow      {report['workflow']}  ({report['cluster']['kind']}, "
             f"{report['cluster']['n_workers']} workers{f' ({per_gpu} per GPU)' if per_gpu > 1 else ''}, "
             f"{report['cluster']['protocol']})"]
    params = ", ".join(f"{k}={_fmt(k, v)}" for k, v in report["params"].items())
    lines.append(f"params        {params}")
    result = ", ".join(f"{k}={_fmt(k, v)}" for k, v in report["result"].items())
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
    rounds = report.get("exchange_rounds")
    if rounds:
        lines.append("exchanged     " + ", ".join(f"{n} round(s) over {kind}" for kind, n in sorted(rounds.items()))
                     + " (the exchanges' steps)")
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


#: result keys whose list is a complex number, [real, imaginary] (JSON has no complex)
COMPLEX_KEYS = ("checksum",)


def _fmt(key: str, v):
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list) and key in COMPLEX_KEYS and len(v) == 2:
        return f"{complex(*v):.6g}"
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return "x".join(map(str, v))  # a shape or chunks
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(key, x) for x in v) + "]"
    return str(v)
