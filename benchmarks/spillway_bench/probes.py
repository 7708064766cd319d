"""The GPU measurements behind :mod:`spillway_bench.ceilings`, run in child processes and
never imported by the package (runpy would warn): ``python -m spillway_bench.probes device
NBYTES`` prints the device ceilings as one JSON line; ``ucxx-server NBYTES`` prints
``{"port": ...}`` once it listens, ``ucxx-client NBYTES PORT`` prints ``{"gbps": ...}``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

#: timed repetitions after one warm-up copy
ITERATIONS = 10



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
        gbps["fp64_gemm_tflops"] = _gemm_tflops(cupy, stream)


#: the GEMM the FP64 ceiling is measured with: large enough to reach cuBLAS's rate
GEMM_N = 8192


def _gemm_tflops(cupy, stream) -> float:
    """cuBLAS's FP64 matrix product rate (TFLOP/s), the compute bound of matmul workloads."""
    x = cupy.random.default_rng(0).random((GEMM_N, GEMM_N))
    y = cupy.random.default_rng(1).random((GEMM_N, GEMM_N))
    out = cupy.empty_like(x)
    with stream:
        t = _events_time(cupy, stream, lambda: cupy.matmul(x, y, out=out), 5)
    return 2 * GEMM_N ** 3 * 5 / t / 1e12


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
    failed = []

    async def handle(ep):
        # ucxx logs and swallows a handler's exception: keep it so the server exits with it
        try:
            for _ in range(1 + ITERATIONS):
                await ep.recv(buf)
            await ep.send(np.ones(1, dtype=np.uint8))
            with contextlib.suppress(Exception):  # the client may close first
                await ep.close()
        except Exception as e:
            failed.append(e)
        finally:
            done.set()

    listener = ucxx.create_listener(handle, port=0)
    print(json.dumps({"port": listener.port}), flush=True)
    await asyncio.wait_for(done.wait(), timeout=240)
    listener.close()
    if failed:
        raise failed[0]


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
