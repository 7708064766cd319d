"""The ceilings the workloads are read against: what the hardware moves without dask.

* ``hbm_copy``: device-to-device copy on one GPU, counted as bytes read plus written;
* ``peer_copy_<a>_to_<b>``: ``cudaMemcpyPeerAsync`` from GPU a to GPU b (NVLink where
  there is one); ``peer_copy`` is the mean of the two directions, the ceiling a worker's
  incoming transfers are compared with;
* ``h2d_pinned`` / ``d2h_pinned``: copies between pinned host memory and GPU 0, the path
  spilling takes;
* ``ucxx_send_recv``: UCXX alone, one process per GPU, sending chunk-sized CuPy buffers
  over CUDA IPC, the transport distributed-ucxx uses between workers;
* ``host_copy``: a NumPy copy in host memory (measured everywhere; on CPU workers it is
  the only ceiling).

GPU measurements run in child processes (``python -m service.bench.ceilings``) so their
CUDA contexts and buffers are gone before any cluster starts. A ceiling that cannot be
measured here (no GPU, one GPU, no UCXX) is left out with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

#: timed repetitions after one warm-up copy
ITERATIONS = 10

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
        return self.gbps.get("peer_copy")

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


def measure(kind: str, devices: tuple, nbytes: int, *, log=None, timeout: float = 300) -> Ceilings:
    """All ceilings for a run on ``kind`` workers ("gpu"/"cpu") over ``devices``."""
    out = Ceilings(nbytes=nbytes)
    # at least 64 MiB so the copy runs from memory, not from the caches
    out.gbps["host_copy"] = host_copy_gbps(min(max(nbytes, 64 * 2**20), 256 * 2**20))
    gpu_names = ["hbm_copy", "peer_copy", "h2d_pinned", "d2h_pinned", "ucxx_send_recv"]
    if kind != "gpu":
        for name in gpu_names:
            out.skipped[name] = "CPU workers: no GPU in this run"
        _report(out, log)
        return out
    devices = physical(devices)
    visible = ",".join(devices)
    try:
        device = _child(["device", str(nbytes)], {"CUDA_VISIBLE_DEVICES": visible}, timeout)
    except RuntimeError as e:
        device = {"skipped": {n: str(e) for n in gpu_names[:4]}}
    out.gbps.update(device.get("gbps", {}))
    out.skipped.update(device.get("skipped", {}))
    if len(devices) < 2:
        out.skipped["ucxx_send_recv"] = "one GPU: no worker-to-worker transfers to bound"
    else:
        try:
            out.gbps["ucxx_send_recv"] = ucxx_gbps(devices[0], devices[1], nbytes, timeout=timeout)
        except RuntimeError as e:
            out.skipped["ucxx_send_recv"] = str(e)
    _report(out, log)
    return out


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
    """Run this module in a child process and return the JSON object it prints last."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "service.bench.ceilings", *args],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{args[0]} measurement took longer than {timeout:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{' '.join(args[:1])} measurement failed: {tail}")
    return json.loads(lines[-1])


def ucxx_gbps(src: int | str, dst: int | str, nbytes: int, *, timeout: float = 300) -> float:
    """UCXX send bandwidth from GPU ``src`` to GPU ``dst``, one process each."""
    import importlib.util

    if importlib.util.find_spec("ucxx") is None:
        raise RuntimeError("ucxx is not installed (install spillway[cuda13])")
    import select
    import tempfile

    # stderr to a file: UCX may warn at length, and a full pipe would stall the server
    with tempfile.TemporaryFile(mode="w+") as errors:
        server = subprocess.Popen(
            [sys.executable, "-m", "service.bench.ceilings", "ucxx-server", str(nbytes)],
            env={**os.environ, **UCX_ENV, "CUDA_VISIBLE_DEVICES": str(dst)},
            stdout=subprocess.PIPE, stderr=errors, text=True,
        )
        try:
            ready, _, _ = select.select([server.stdout], [], [], 120)
            line = server.stdout.readline() if ready else ""
            if not line.startswith("{"):
                server.kill()
                server.wait()
                errors.seek(0)
                tail = (errors.read().strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"ucxx server did not start: {tail}")
            port = json.loads(line)["port"]
            result = _child(["ucxx-client", str(nbytes), str(port)],
                            {**UCX_ENV, "CUDA_VISIBLE_DEVICES": str(src)}, timeout)
            return result["gbps"]
        finally:
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


# --- the measurements themselves, run inside the child processes


def _events_time(cupy, stream, body, iterations: int) -> float:
    """Seconds for ``iterations`` calls of ``body`` on ``stream``, by CUDA events."""
    body()
    stream.synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(iterations):
        body()
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / 1e3


def device_ceilings(nbytes: int) -> dict:
    import cupy

    rt = cupy.cuda.runtime
    gbps, skipped = {}, {}
    n_dev = rt.getDeviceCount()

    try:
        _single_device(cupy, nbytes, gbps)
    except Exception as e:  # report it and go on to the peer copies
        for name in ("hbm_copy", "h2d_pinned", "d2h_pinned"):
            skipped.setdefault(name, f"failed: {type(e).__name__}: {e}")
    if n_dev < 2:
        skipped["peer_copy"] = "one GPU: no peer to copy to"
        return {"gbps": gbps, "skipped": skipped}
    try:
        _peer(cupy, nbytes, gbps)
    except Exception as e:
        skipped["peer_copy"] = f"failed: {type(e).__name__}: {e}"
    return {"gbps": gbps, "skipped": skipped}


def _single_device(cupy, nbytes: int, gbps: dict) -> None:
    rt = cupy.cuda.runtime
    with cupy.cuda.Device(0):
        stream = cupy.cuda.Stream()
        a = cupy.ones(nbytes, dtype=cupy.uint8)
        b = cupy.empty_like(a)
        t = _events_time(cupy, stream, lambda: rt.memcpyAsync(
            b.data.ptr, a.data.ptr, nbytes, rt.memcpyDeviceToDevice, stream.ptr), ITERATIONS)
        gbps["hbm_copy"] = 2 * nbytes * ITERATIONS / t / 1e9

        pinned = cupy.cuda.alloc_pinned_memory(nbytes)
        t = _events_time(cupy, stream, lambda: rt.memcpyAsync(
            b.data.ptr, pinned.ptr, nbytes, rt.memcpyHostToDevice, stream.ptr), ITERATIONS)
        gbps["h2d_pinned"] = nbytes * ITERATIONS / t / 1e9
        t = _events_time(cupy, stream, lambda: rt.memcpyAsync(
            pinned.ptr, b.data.ptr, nbytes, rt.memcpyDeviceToHost, stream.ptr), ITERATIONS)
        gbps["d2h_pinned"] = nbytes * ITERATIONS / t / 1e9


def _peer(cupy, nbytes: int, gbps: dict) -> None:
    rt = cupy.cuda.runtime
    buffers = {}
    for dev in (0, 1):
        with cupy.cuda.Device(dev):
            buffers[dev] = cupy.ones(nbytes, dtype=cupy.uint8)
            other = 1 - dev
            if rt.deviceCanAccessPeer(dev, other):
                try:
                    rt.deviceEnablePeerAccess(other)
                except cupy.cuda.runtime.CUDARuntimeError:
                    pass  # already enabled
    directions = []
    for src, dst in ((0, 1), (1, 0)):
        with cupy.cuda.Device(src):
            stream = cupy.cuda.Stream()
            t = _events_time(cupy, stream, lambda: rt.memcpyPeerAsync(
                buffers[dst].data.ptr, dst, buffers[src].data.ptr, src, nbytes, stream.ptr), ITERATIONS)
        value = nbytes * ITERATIONS / t / 1e9
        gbps[f"peer_copy_{src}_to_{dst}"] = value
        directions.append(value)
    gbps["peer_copy"] = sum(directions) / len(directions)


async def _ucxx_server(nbytes: int) -> None:
    import asyncio

    import cupy
    import numpy as np
    import ucxx

    buf = cupy.empty(nbytes, dtype=cupy.uint8)  # creates the CUDA context before UCX starts
    done = asyncio.Event()

    async def handle(ep):
        for _ in range(1 + ITERATIONS):
            await ep.recv(buf)
        await ep.send(np.ones(1, dtype=np.uint8))
        with contextlib.suppress(Exception):  # the client may close first
            await ep.close()
        done.set()

    listener = ucxx.create_listener(handle, port=0)
    print(json.dumps({"port": listener.port}), flush=True)
    await asyncio.wait_for(done.wait(), timeout=240)
    listener.close()


async def _ucxx_client(nbytes: int, port: int) -> None:
    import cupy
    import numpy as np
    import ucxx

    buf = cupy.ones(nbytes, dtype=cupy.uint8)
    cupy.cuda.runtime.deviceSynchronize()
    ep = await ucxx.create_endpoint("127.0.0.1", port)
    await ep.send(buf)  # warm-up: wires up the transports and caches the IPC handle
    ack = np.empty(1, dtype=np.uint8)
    t0 = time.perf_counter()
    for _ in range(ITERATIONS):
        await ep.send(buf)
    await ep.recv(ack)
    elapsed = time.perf_counter() - t0
    with contextlib.suppress(Exception):  # the measurement is done; a close race is harmless
        await ep.close()
    print(json.dumps({"gbps": nbytes * ITERATIONS / elapsed / 1e9}), flush=True)


def main(argv: list[str]) -> None:
    import asyncio

    what, nbytes = argv[0], int(argv[1])
    if what == "device":
        print(json.dumps(device_ceilings(nbytes)), flush=True)
    elif what == "ucxx-server":
        asyncio.run(_ucxx_server(nbytes))
    elif what == "ucxx-client":
        asyncio.run(_ucxx_client(nbytes, int(argv[2])))
    else:
        raise SystemExit(f"unknown measurement {what!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
