"""The ceilings the workloads are read against, what the hardware moves without dask
(``benchmarks/README.md`` lists them): device copies, peer copies, pinned copies and the
FP64 GEMM in child processes (:mod:`.probes`, so their CUDA contexts are gone before any
cluster starts), UCXX send/receive between two processes, the host copy, and the disk
tier's fsync'd writes and uncached reads. A ceiling that cannot be measured is skipped with
the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

#: how a child measurement is started: the probes module, run (never imported) by -m
PROBE = (sys.executable, "-m", "spillway_bench.probes")

#: seconds the UCXX server may take to listen (CUDA context and UCX start-up)
SERVER_START_S = 120

#: environment of the UCXX measurement: the transports dask-cuda enables for NVLink
UCX_ENV = {"UCX_TLS": "tcp,cuda_copy,cuda_ipc", "UCX_TCP_CM_REUSEADDR": "y"}


@dataclass
class Ceilings:
    #: GB/s (1e9 bytes per second) by name
    gbps: dict[str, float] = field(default_factory=dict)
    #: name -> why it was not measured
    skipped: dict[str, str] = field(default_factory=dict)
    nbytes: int = 0

    @property
    def peer_copy(self) -> float | None:
        """The ceiling a worker's incoming transfers are read against: the peer copy
        between GPUs, or where the workers share one GPU, one copy within it."""
        return self.gbps.get("peer_copy") or self.gbps.get("same_gpu_copy")

    def to_json(self) -> dict:
        return {"gbps": dict(self.gbps), "skipped": dict(self.skipped), "bytes": self.nbytes}


def host_copy_gbps(nbytes: int, iterations: int = 3) -> float:
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(iterations):
        np.copyto(dst, src)
    elapsed = time.perf_counter() - t0
    return 2 * nbytes * iterations / elapsed / 1e9


#: bytes the disk ceilings write in all: several chunks, within these bounds, so the
#: figure is the disk's (past its write cache), not one file's
DISK_BYTES = (256 * 2**20, 4 * 2**30)


def disk_gbps(nbytes: int, directory: str | None = None) -> dict[str, float]:
    """``disk_write`` and ``disk_read`` GB/s through the disk tier in ``directory`` (the
    spill directory; the system's temporary directory when None)."""
    import numpy as np

    from spillway.memory.codecs import HostCopy
    from spillway.memory.disk import DiskTier

    lo, hi = DISK_BYTES
    piece = max(1, min(nbytes, hi))
    count = max(1, min(max(4 * piece, lo), hi) // piece)
    source = np.random.default_rng(0).integers(0, 255, piece, dtype=np.uint8)
    disk = DiskTier(directory)
    try:
        copy = HostCopy((piece,), source.dtype, "C", source)
        t0 = time.perf_counter()
        for i in range(count):
            disk.put(i, copy)
        paths = [disk.meta[i][0] for i in range(count)]
        for path in paths:
            _sync_and_drop(path)
        write = piece * count / (time.perf_counter() - t0) / 1e9
        t0 = time.perf_counter()
        for i in range(count):
            back = disk.get(i, lambda n: np.empty(n, dtype=np.uint8))
        read = piece * count / (time.perf_counter() - t0) / 1e9
        if not np.array_equal(back.buffer, source):
            raise OSError(f"the disk tier read back other bytes than it wrote in {disk.directory}")
        return {"disk_write": write, "disk_read": read}
    finally:
        disk.close()


def _sync_and_drop(path: str) -> None:
    """Wait until ``path`` is on disk, then drop it from the page cache (so the read
    that follows comes from the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def not_measured(kind: str, devices: tuple, nbytes: int, *, log=None, **_) -> Ceilings:
    """:func:`measure`'s stand-in for ``--no-ceilings``: every ceiling skipped."""
    return Ceilings(nbytes=nbytes, skipped={"all": "--no-ceilings"})


#: the ceilings only GPU workers have
GPU_NAMES = ("hbm_copy", "peer_copy", "h2d_pinned", "d2h_pinned", "ucxx_send_recv")


def measure(kind: str, devices: tuple, nbytes: int, *, log=None, timeout: float = 300,
            directory: str | None = None) -> Ceilings:
    """All ceilings for a run on ``kind`` workers ("gpu"/"cpu") over ``devices``."""
    out = Ceilings(nbytes=nbytes)
    # at least 64 MiB so the copy runs from memory, not from the caches
    out.gbps["host_copy"] = host_copy_gbps(min(max(nbytes, 64 * 2**20), 256 * 2**20))
    try:
        out.gbps.update(disk_gbps(nbytes, directory))
    except OSError as e:
        out.skipped["disk_write"] = out.skipped["disk_read"] = f"{type(e).__name__}: {e}"
    if kind != "gpu":
        for name in GPU_NAMES:
            out.skipped[name] = "CPU workers: no GPU in this run"
    else:
        gbps, skipped = gpu_ceilings(devices, nbytes, timeout=timeout)
        out.gbps.update(gbps)
        out.skipped.update(skipped)
    _report(out, log)
    return out


def gpu_ceilings(devices: tuple, nbytes: int, *, timeout: float = 300) -> tuple[dict, dict]:
    """The GPU ceilings at ``nbytes`` over ``devices``: GB/s by name, and why each one
    left out was not measured."""
    gbps, skipped = {}, {}
    devices = physical(devices)
    # a GPU appears once per worker of it (workers-per-gpu); CUDA takes each GPU once
    gpus = tuple(dict.fromkeys(devices))
    try:
        device = _child(["device", str(nbytes)], {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}, timeout)
    except RuntimeError as e:
        device = {"skipped": {n: str(e) for n in GPU_NAMES[:4]}}
    gbps.update(device.get("gbps", {}))
    skipped.update(device.get("skipped", {}))
    if len(gpus) < len(devices) and "hbm_copy" in gbps:
        # workers of one GPU: a transfer between them is at best one copy within its
        # memory, hbm_copy counts the bytes read and written
        gbps["same_gpu_copy"] = gbps["hbm_copy"] / 2
    if len(devices) < 2:
        skipped["ucxx_send_recv"] = "one GPU: no worker-to-worker transfers to bound"
    else:
        try:
            gbps["ucxx_send_recv"] = ucxx_gbps(devices[0], devices[1], nbytes, timeout=timeout)
        except RuntimeError as e:
            skipped["ucxx_send_recv"] = str(e)
    return gbps, skipped


def _report(out: Ceilings, log) -> None:
    if log is None:
        return
    for name, value in out.gbps.items():
        log(f"ceiling {name:<18} {value:8.1f} GB/s")
    for name, why in out.skipped.items():
        log(f"ceiling {name:<18} skipped: {why}")


def physical(devices: tuple) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES entries for GPU indices that count within this process's
    own CUDA_VISIBLE_DEVICES (how the inventory numbers them)."""
    parent = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    out = []
    for d in devices:
        if isinstance(d, int) and parent and d < len(parent):
            out.append(parent[d])
        else:
            out.append(str(d))
    return tuple(out)


def _child(args: list[str], env: dict, timeout: float) -> dict:
    """Run one probe in a child process and return the JSON object it prints last."""
    try:
        proc = subprocess.run(
            [*PROBE, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{args[0]} measurement took longer than {timeout:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(args[:1])} measurement failed: {last_error(proc.stderr)}")
    return json.loads(lines[-1])


def last_error(stderr: str) -> str:
    """The line of a child's stderr that says what went wrong: the last one that is not a
    warning (libraries warn at start-up; the error comes after), else the last line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "no output"
    warnings = [ln for ln in lines if "Warning:" in ln]
    # a warning is printed with the source line that raised it
    errors = [ln for ln in lines if "Warning:" not in ln and not ln.startswith("warnings.warn")]
    return (errors or warnings or lines)[-1]


def start_server(argv: list[str], env: dict, errors, timeout: float = SERVER_START_S):
    """Start a server child and wait for the first JSON line it prints on stdout (what it
    listens on); returns ``(process, that object)``. Lines before it, and anything on
    stderr (``errors``, a file: a full pipe would stall the child), are not failures; the
    child exiting or staying silent for ``timeout`` seconds is, with the reason."""
    import queue
    import threading

    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
    lines: queue.Queue = queue.Queue()

    def read():
        # a thread, not select(): a line already buffered by readline would not wake select
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF: the child exited

    threading.Thread(target=read, daemon=True, name="spillway-server-stdout").start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            why = f"no ready line within {timeout:.0f} s"
            break
        if line is None:
            why = f"exited with status {proc.wait()}"
            break
        if line.startswith("{"):
            try:
                return proc, json.loads(line)
            except ValueError:
                pass  # not the ready line
    proc.wait()
    errors.seek(0)
    raise RuntimeError(f"{why}: {last_error(errors.read())}")


def ucxx_gbps(src: int | str, dst: int | str, nbytes: int, *, timeout: float = 300) -> float:
    """UCXX send bandwidth from GPU ``src`` to GPU ``dst``, one process each."""
    import importlib.util

    if importlib.util.find_spec("ucxx") is None:
        raise RuntimeError("ucxx is not installed (install spillway[cuda13])")
    import tempfile

    with tempfile.TemporaryFile(mode="w+") as errors:
        try:
            server, ready = start_server(
                [*PROBE, "ucxx-server", str(nbytes)],
                {**os.environ, **UCX_ENV, "CUDA_VISIBLE_DEVICES": str(dst)}, errors)
        except RuntimeError as e:
            raise RuntimeError(f"ucxx server did not start: {e}") from None
        try:
            result = _child(["ucxx-client", str(nbytes), str(ready["port"])],
                            {**UCX_ENV, "CUDA_VISIBLE_DEVICES": str(src)}, timeout)
            return result["gbps"]
        finally:
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
