"""Where the time of one worker-to-worker transfer goes: the same chunk moved four ways.

``python -m spillway_bench.transfer_anatomy [--sizes 16MiB,256MiB,1GiB] [--cpu]`` times, on
one GPU with two processes, each layer of distributed's worker-to-worker path alone, with
the exchange a worker makes (distributed's gather: a request, the data, an ``OK``):

``raw``              ucxx's async API alone: an 8-byte request, the device buffer (a fresh
                     ``rmm.DeviceBuffer`` on the receiver, as distributed-ucxx allocates it),
                     an 8-byte OK; ucxx in distributed-ucxx's progress mode (blocking)
``raw-thread``       the same in ucxx's own default progress mode (thread)
``comm``             distributed's comm layer alone (``distributed.comm.listen``/``connect``
                     on ``ucx://``): ``write({"op": "get_data"})``, the reply
                     ``{"status": "OK", "data": {"x": to_serialize(array)}}``, ``write("OK")``,
                     with the default serializers; (de)serialization of messages over
                     ``distributed.comm.offload`` (10 MiB) runs on distributed's offload thread
``comm-no-offload``  the same with the offload threshold raised above every size (no thread hop)
``workers``          the full gather between two spillway workers of the GPU (as
                     :mod:`spillway_bench.transfers` moves a chunk), split by the workers' own
                     books: the receiver's ``transfer_incoming_log``, the sender's
                     outgoing transfer log and both workers' ``digests_total``
                     (distributed's ``context_meter``: serialize, deserialize, network)
``workers-no-offload`` the same with the workers started with the threshold raised

``-python-future`` rows: ucxx's progress thread with its requests completed as asyncio
futures (``UCXPY_PROGRESS_MODE=thread UCXPY_ENABLE_PYTHON_FUTURE=1``). Without them (the
default) each pending ucxx send or receive polls ``asyncio.sleep(0)``, so a worker's event
loop spins and holds the GIL whenever a comm waits, and the offload thread waits for the
GIL (up to ``sys.getswitchinterval()``, 5 ms) at each hop. ``comm-multi-buffer``:
distributed-ucxx's one send of all frames (it hung the workers' rig), last.

The difference between rows says where the time goes: ``comm - raw`` is distributed-ucxx's
framing (two metadata messages before each message's frames) and (de)serialization,
``comm - comm-no-offload`` the offload thread's hops, ``workers - comm`` the worker itself
(the request handler, the store's lookup, the state machine's books).

Every process of a pair stamps each step with ``time.perf_counter`` (CLOCK_MONOTONIC, one
clock for all processes of a Linux host), so a step's time is the difference of two stamps
even when they come from the two processes. In the ``comm`` rows the probe's own two
processes wrap distributed's ``to_frames``/``from_frames`` and ``protocol.dumps``/``loads``
to time (de)serialization and the thread hop apart from the wire; the workers are not
patched (their books are distributed's own).

``--cpu``: the stand-in that runs without a GPU: ``tcp://`` and NumPy arrays, the rows
``comm``, ``comm-no-offload`` and ``workers`` (distributed's LocalCluster of two processes);
``raw`` needs ucxx. JSON goes to ``--out`` (or stdout), the short table is printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import statistics
import subprocess
import sys
import threading
import time

from .transfers import _make, _parse_sizes, _same_bits, two_workers

SIZES = "16MiB,256MiB,1GiB"
REPEATS = 5
#: ucxx's progress by a thread of its own, each request's completion handed to asyncio as a
#: future by ucxx's notifier thread; otherwise (distributed-ucxx's blocking mode, or thread
#: mode alone) every pending send or receive is a coroutine polling ``asyncio.sleep(0)``,
#: which keeps the event loop spinning and holding the GIL while any comm waits
PYTHON_FUTURE = {"UCXPY_PROGRESS_MODE": "thread", "UCXPY_ENABLE_PYTHON_FUTURE": "1"}
#: distributed.comm.offload where a row turns the thread hop off: above any transfer size
NO_OFFLOAD = {"DASK_DISTRIBUTED__COMM__OFFLOAD": "1TiB"}
#: the environment each row's processes start with (beside the device and the pool)
ROW_ENV = {
    "raw": {"UCXPY_PROGRESS_MODE": "blocking"},
    "raw-thread": {"UCXPY_PROGRESS_MODE": "thread"},
    "raw-python-future": PYTHON_FUTURE,
    "comm": {},
    "comm-no-offload": NO_OFFLOAD,
    "comm-python-future": PYTHON_FUTURE,
    "comm-no-offload-python-future": {**NO_OFFLOAD, **PYTHON_FUTURE},
    "workers": {},
    "workers-no-offload": NO_OFFLOAD,
    "workers-python-future": PYTHON_FUTURE,
    "workers-no-offload-python-future": {**NO_OFFLOAD, **PYTHON_FUTURE},
    # distributed-ucxx's one send of all frames (it left the workers' rig hanging: does the
    # comm layer alone hang too?)
    "comm-multi-buffer": {"DASK_DISTRIBUTED_UCXX__MULTI_BUFFER": "True"},
}
#: the transports of a spillway GPU worker (dask-cuda's, with nvlink on: TCP, CUDA copy, CUDA
#: IPC), for the probe's own GPU pairs, where the environment names none
GPU_TRANSPORTS = {
    "comm": {"DASK_DISTRIBUTED_UCXX__TCP": "True", "DASK_DISTRIBUTED_UCXX__NVLINK": "True",
             "DASK_DISTRIBUTED_UCXX__CUDA_COPY": "True"},
    "raw": {"UCX_TLS": "tcp,cuda_copy,cuda_ipc", "UCX_SOCKADDR_TLS_PRIORITY": "tcp"},
}
#: in this order; the rows most likely to hang (a notifier thread at exit, multi-buffer) last
GPU_ROWS = tuple(ROW_ENV)
CPU_ROWS = ("comm", "comm-no-offload", "workers")
#: seconds a child may take to start listening, and a pair to finish
START_TIMEOUT = 120
PAIR_TIMEOUT = 90
#: seconds one move between workers may take (a hang fails the row, not the probe)
MOVE_TIMEOUT = 60
now = time.perf_counter


# --- the probe's own processes: a sender (listens, holds the chunk) and a receiver


def _setup_gpu(pool: int) -> None:
    """An RMM pool with CuPy on it, as spillway's workers have: the sender's chunk and
    the receiver's buffer come from one pool each, so CUDA IPC opens the sender's pool once
    (UCX caches the handle) instead of once per chunk."""
    import cupy
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    if pool:
        rmm.reinitialize(pool_allocator=True, initial_pool_size=pool)
    cupy.cuda.set_allocator(rmm_cupy_allocator)


def _sync(module: str) -> None:
    if module == "cupy":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


# spans (name, start, stop, thread) of the wrapped (de)serialization calls of this process
_SPANS: list[tuple[str, float, float, str]] = []


def _timed(name, fn, is_async):
    if is_async:
        async def wrapper(*args, **kwargs):
            t0 = now()
            try:
                return await fn(*args, **kwargs)
            finally:
                _SPANS.append((name, t0, now(), threading.current_thread().name))
    else:
        def wrapper(*args, **kwargs):
            t0 = now()
            try:
                return fn(*args, **kwargs)
            finally:
                _SPANS.append((name, t0, now(), threading.current_thread().name))
    return wrapper


def _wrap_serialization(scheme: str) -> None:
    """Time ``to_frames``/``from_frames`` (with the offload hop) and ``protocol.dumps``/
    ``loads`` (the work itself, on whichever thread) in this probe process only."""
    import distributed.protocol
    from distributed.comm import registry
    from distributed.comm import utils as comm_utils

    registry.get_backend(scheme)  # imports the backend's module, which took to_frames by name
    originals = {"to_frames": comm_utils.to_frames, "from_frames": comm_utils.from_frames}
    for mod in [m for name, m in list(sys.modules.items())
                if m is not None and name.startswith(("distributed.comm", "distributed_ucxx"))]:
        for name, fn in originals.items():
            if getattr(mod, name, None) is fn:
                setattr(mod, name, _timed(name, fn, True))
    distributed.protocol.dumps = _timed("dumps", distributed.protocol.dumps, False)
    distributed.protocol.loads = _timed("loads", distributed.protocol.loads, False)


def _spans_since(t0: float) -> list:
    return [s for s in _SPANS if s[1] >= t0]


async def _comm_sender(args) -> None:
    from distributed.comm import listen
    from distributed.protocol import to_serialize

    _wrap_serialization(args.scheme)
    stamps, chunk, done = [], {}, asyncio.Event()

    async def handle(comm):
        try:
            while True:
                t_in = now()
                msg = await comm.read()
                if msg["op"] == "make":  # untimed: the chunk exists before it is asked for
                    chunk["x"] = _make(msg["nbytes"], msg["seed"], args.module)
                    _sync(args.module)
                    await comm.write("ready")
                elif msg["op"] == "get_data":
                    t_req = now()
                    reply = {"status": "OK", "data": {"x": to_serialize(chunk["x"])}}
                    t_w0 = now()
                    await comm.write(reply)
                    t_w1 = now()
                    ok = await comm.read()
                    t_ok = now()
                    assert ok == "OK", ok
                    stamps.append({"t_req": t_req, "t_w0": t_w0, "t_w1": t_w1, "t_ok": t_ok,
                                   "spans": _spans_since(t_in)})
                else:  # close: hand the stamps over
                    await comm.write({"stamps": stamps})
                    return
        finally:
            await comm.close()
            done.set()

    listener = listen(f"{args.scheme}://127.0.0.1:0", handle, deserialize=True)
    await listener.start()
    print(json.dumps({"address": listener.contact_address}), flush=True)
    await asyncio.wait_for(done.wait(), PAIR_TIMEOUT)
    listener.stop()


def _span(spans, name, after):
    """The first span called ``name`` that starts at or after ``after``."""
    found = [s for s in spans if s[0] == name and s[1] >= after]
    return min(found, key=lambda s: s[1]) if found else None


def _ms(a, b):
    return None if a is None or b is None else (b - a) * 1e3


async def _comm_receiver(args) -> dict:
    from distributed.comm import connect

    _wrap_serialization(args.scheme)
    comm = await connect(args.address, deserialize=True)
    mine, seed = [], 1000
    for nbytes in args.sizes:
        for i in range(1 + args.repeats):  # the first: warm-up (a new size's buffers)
            await comm.write({"op": "make", "nbytes": nbytes, "seed": seed})
            assert await comm.read() == "ready"
            t0 = now()
            await comm.write({"op": "get_data", "keys": ["x"], "who": "probe"})
            t_wr = now()
            reply = await comm.read()
            t_rd = now()
            await comm.write("OK")
            t_end = now()
            same = _same_bits(reply["data"]["x"], nbytes, seed, args.module)
            mine.append({"bytes": nbytes, "warm_up": i == 0, "same_bits": same, "t0": t0, "t_wr": t_wr,
                         "t_rd": t_rd, "t_end": t_end, "spans": _spans_since(t0)})
            del reply
            seed += 1
    await comm.write({"op": "close"})
    theirs = (await comm.read())["stamps"]
    await comm.close()
    steps = []
    for r, s in zip(mine, theirs, strict=True):
        to_f = _span(s["spans"], "to_frames", s["t_w0"])
        dumps = _span(s["spans"], "dumps", s["t_w0"])
        from_f = _span(r["spans"], "from_frames", r["t_wr"])
        loads = _span(r["spans"], "loads", r["t_wr"])
        steps.append({
            "bytes": r["bytes"], "warm_up": r["warm_up"], "same_bits": r["same_bits"],
            "total": _ms(r["t0"], r["t_end"]),
            # the request written, read and its handler reached on the sender
            "request": _ms(r["t0"], s["t_req"]),
            "sender: reply built": _ms(s["t_req"], s["t_w0"]),
            "sender to_frames": _ms(to_f and to_f[1], to_f and to_f[2]),
            # to_frames' start to dumps' start and dumps' end to to_frames' end: the hop to the
            # offload thread and back (the GIL handed over twice), about 0 without offload
            "sender to_frames: hop in": _ms(to_f and to_f[1], dumps and dumps[1]),
            "sender to_frames: dumps": _ms(dumps and dumps[1], dumps and dumps[2]),
            "sender to_frames: hop out": _ms(dumps and dumps[2], to_f and to_f[2]),
            # the frames' metadata messages and the frames themselves, to the receiver's
            # from_frames: what UCX (or TCP) and distributed-ucxx's framing take
            "wire": _ms(to_f and to_f[2], from_f and from_f[1]),
            "receiver from_frames": _ms(from_f and from_f[1], from_f and from_f[2]),
            "receiver from_frames: hop in": _ms(from_f and from_f[1], loads and loads[1]),
            "receiver from_frames: loads": _ms(loads and loads[1], loads and loads[2]),
            "receiver from_frames: hop out": _ms(loads and loads[2], from_f and from_f[2]),
            "receiver: read returns": _ms(from_f and from_f[2], r["t_rd"]),
            "receiver: OK written": _ms(r["t_rd"], r["t_end"]),
            "sender: OK read": _ms(s["t_w1"], s["t_ok"]),
            # where the chunk's (de)serialization ran: distributed's offload thread or the loop
            "threads": {"dumps": dumps and dumps[3], "loads": loads and loads[3]},
        })
    return {"steps": steps}


async def _raw_sender(args) -> None:
    import numpy as np
    import ucxx

    ucxx.init(progress_mode=os.environ.get("UCXPY_PROGRESS_MODE", "blocking"))
    stamps, chunk, done, failed = [], {}, asyncio.Event(), []

    async def handle(ep):
        try:
            header = np.empty(3, dtype=np.uint64)  # op, bytes, seed
            ack = np.ones(1, dtype=np.uint64)
            while True:
                await ep.recv(header)
                op, nbytes, seed = (int(v) for v in header)
                if op == 1:  # make, untimed
                    chunk["x"] = _make(nbytes, seed, args.module)
                    _sync(args.module)
                    await ep.send(ack)
                elif op == 2:  # get: the request is in
                    t_req = now()
                    _sync(args.module)  # distributed-ucxx synchronizes before sending device frames
                    t_sync = now()
                    await ep.send(chunk["x"])
                    t_sent = now()
                    await ep.recv(ack)
                    stamps.append({"t_req": t_req, "t_sync": t_sync, "t_sent": t_sent, "t_ok": now()})
                else:
                    body = np.frombuffer(json.dumps(stamps).encode(), dtype=np.uint8)
                    await ep.send(np.array([body.nbytes], dtype=np.uint64))
                    await ep.send(body)
                    return
        except Exception as e:  # ucxx logs and swallows a handler's exception
            failed.append(e)
        finally:
            done.set()

    listener = ucxx.create_listener(handle, port=0)
    print(json.dumps({"address": f"127.0.0.1:{listener.port}"}), flush=True)
    await asyncio.wait_for(done.wait(), PAIR_TIMEOUT)
    listener.close()
    if failed:
        raise failed[0]


async def _raw_receiver(args) -> dict:
    import numpy as np
    import ucxx

    ucxx.init(progress_mode=os.environ.get("UCXPY_PROGRESS_MODE", "blocking"))
    if args.module == "cupy":
        import cupy
        import rmm

        def alloc(n):
            return rmm.DeviceBuffer(size=n)

        def as_array(buf):
            return cupy.asarray(buf).view(cupy.float64)
    else:
        def alloc(n):
            return np.empty(n, dtype=np.uint8)

        def as_array(buf):
            return buf.view(np.float64)

    host, port = args.address.rsplit(":", 1)
    ep = await ucxx.create_endpoint(host, int(port))
    mine, seed, ack = [], 1000, np.ones(1, dtype=np.uint64)
    for nbytes in args.sizes:
        for i in range(1 + args.repeats):
            await ep.send(np.array([1, nbytes, seed], dtype=np.uint64))
            await ep.recv(ack)
            t0 = now()
            await ep.send(np.array([2, nbytes, seed], dtype=np.uint64))
            t_a0 = now()
            buf = alloc(nbytes)
            _sync(args.module)  # distributed-ucxx synchronizes after allocating device frames
            t_a1 = now()
            await ep.recv(buf)
            t_recv = now()
            await ep.send(ack)
            t_end = now()
            mine.append({"bytes": nbytes, "warm_up": i == 0, "t0": t0, "t_a0": t_a0, "t_a1": t_a1,
                         "t_recv": t_recv, "t_end": t_end,
                         "same_bits": _same_bits(as_array(buf), nbytes, seed, args.module)})
            seed += 1
    await ep.send(np.array([0, 0, 0], dtype=np.uint64))
    size = np.empty(1, dtype=np.uint64)
    await ep.recv(size)
    body = np.empty(int(size[0]), dtype=np.uint8)
    await ep.recv(body)
    theirs = json.loads(body.tobytes())
    steps = [{"bytes": r["bytes"], "warm_up": r["warm_up"], "same_bits": r["same_bits"],
              "total": _ms(r["t0"], r["t_end"]),
              "request": _ms(r["t0"], s["t_req"]),
              "receiver: allocate": _ms(r["t_a0"], r["t_a1"]),
              "sender: sync stream": _ms(s["t_req"], s["t_sync"]),
              "wire": _ms(max(s["t_sync"], r["t_a1"]), r["t_recv"]),
              "receiver: OK written": _ms(r["t_recv"], r["t_end"])}
             for r, s in zip(mine, theirs, strict=True)]
    return {"steps": steps}


def _child(args) -> None:
    """One process of a pair. It leaves by ``os._exit``: its result is printed by then, and
    a teardown that waits (ucxx's notifier thread, UCX's endpoints) must not turn a
    measured row into a timed-out one."""
    import traceback

    code = 0
    try:
        if args.module == "cupy":
            _setup_gpu(args.pool)
        raw = args.row.startswith("raw")
        if args.role == "sender":
            asyncio.run((_raw_sender if raw else _comm_sender)(args))
        else:
            print(json.dumps(asyncio.run((_raw_receiver if raw else _comm_receiver)(args))), flush=True)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --- the parent: one pair of processes per row, or a cluster of two workers


def _read_line(proc, timeout: float) -> str:
    """The first stdout line of ``proc`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("{"):
                return line
            if not line:
                break
        elif proc.poll() is not None:
            break
    raise RuntimeError(f"the sender did not start listening within {timeout:.0f} s "
                       f"(exit code {proc.poll()})")


def _pair(row: str, opts, env: dict) -> dict:
    """Run the sender and the receiver of ``row``; the receiver's steps."""
    base = [sys.executable, "-m", "spillway_bench.transfer_anatomy", "--child", "--row", row,
            "--sizes", ",".join(map(str, opts.sizes)), "--repeats", str(opts.repeats),
            "--scheme", opts.scheme, "--module", opts.module, "--pool", str(opts.pool)]
    sender = subprocess.Popen(base + ["--role", "sender"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        address = json.loads(_read_line(sender, START_TIMEOUT))["address"]
        done = subprocess.run(base + ["--role", "receiver", "--address", address], env=env,
                              capture_output=True, text=True, timeout=PAIR_TIMEOUT)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the receiver failed (exit code {done.returncode}): {tail[:300]}")
        sender.wait(timeout=30)
        return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()


def _books(dask_worker) -> dict:
    """The worker's transfers on its own clock (``time.time``, one for all processes of a
    host) and its gather/serve metrics (distributed's ``context_meter`` digests). The logs'
    start and stop carry the scheduler_delay of their moment (it changes with each
    heartbeat), so the raw times come from what has none: the incoming transfer's start
    from the state machine's ``request-dep`` stamp (taken right before the gather's meter
    starts), the outgoing one's from its ``middle``."""
    from spillway import upstream

    requested = {}
    for entry in dask_worker.state.log:
        if entry and entry[0] == "request-dep":
            for key in entry[2]:
                requested[str(key)] = entry[-1]
    incoming = []
    for e in dask_worker.transfer_incoming_log:
        keys = [str(k) for k in e["keys"]]
        start = next((requested[k] for k in keys if k in requested), None)
        incoming.append({"keys": keys, "start": start,
                         "stop": None if start is None else start + e["stop"] - e["start"]})
    outgoing = [{"keys": [str(k) for k in e["keys"]], "start": e["middle"] - (e["stop"] - e["start"]) / 2,
                 "stop": e["middle"] + (e["stop"] - e["start"]) / 2} for e in upstream.outgoing_log(dask_worker)]
    digests = {"/".join(map(str, k if isinstance(k, tuple) else (k,))): v
               for k, v in dask_worker.digests_total.items()
               if any(tag in str(k) for tag in ("gather-dep", "get-data"))}
    return {"incoming": incoming, "outgoing": outgoing, "digests": digests}


def _delta(after: dict, before: dict) -> dict:
    return {k: (v - before.get(k, 0)) * 1e3 for k, v in after.items()
            if k.endswith("seconds") and v - before.get(k, 0) > 0}


def _worker_moves(client, opts) -> dict:
    """Chunks moved between the cluster's two workers, each split by both workers' books."""
    from distributed import wait

    src, dst = two_workers(client)
    steps, seed = [], 1000
    for nbytes in opts.sizes:
        for i in range(1 + opts.repeats):
            made = client.submit(_make, nbytes, seed, opts.module, workers=[src], allow_other_workers=False,
                                 pure=False)
            wait(made, timeout=MOVE_TIMEOUT)
            before = client.run(_books, workers=[src, dst])
            checked = client.submit(_same_bits, made, nbytes, seed, opts.module, workers=[dst],
                                    allow_other_workers=False, pure=False)
            same = checked.result(timeout=MOVE_TIMEOUT)
            after = client.run(_books, workers=[src, dst])
            key = str(made.key)
            incoming = [e for e in after[dst]["incoming"] if key in e["keys"]]
            outgoing = [e for e in after[src]["outgoing"] if key in e["keys"]]
            del made, checked
            if not incoming or not outgoing:
                raise RuntimeError(f"no transfer of {key} in the workers' logs: the chunk did not move")
            into, out = incoming[-1], outgoing[-1]
            if into["start"] is None:
                raise RuntimeError(f"no request-dep of {key} in the receiver's state log")
            in0, in1, out0, out1 = into["start"], into["stop"], out["start"], out["stop"]
            step = {"bytes": nbytes, "warm_up": i == 0, "same_bits": same,
                    "total": (in1 - in0) * 1e3,
                    # the request to the sender's write: request written, read, handler, store lookup
                    "request": (out0 - in0) * 1e3,
                    # the sender's write (serialization included) and its read of the OK
                    "sender: write + OK read": (out1 - out0) * 1e3,
                    # the receiver's OK written, less the sender's read of it: about 0
                    "receiver stop - sender stop": (in1 - out1) * 1e3}
            # the receiver's gather and the sender's serving only (the receiver also serves
            # the client the check's result)
            step.update({f"receiver {k}": v for k, v in _delta(after[dst]["digests"], before[dst]["digests"]).items()
                         if k.startswith("gather-dep")})
            step.update({f"sender {k}": v for k, v in _delta(after[src]["digests"], before[src]["digests"]).items()
                         if k.startswith("get-data")})
            steps.append(step)
            seed += 1
    return {"steps": steps}


def _workers(row: str, opts) -> dict:
    import dask

    extra = ROW_ENV.get(row, {})
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)  # the workers' processes inherit it; distributed reads it at import
    try:
        offload = extra.get(*NO_OFFLOAD)
        with dask.config.set({"distributed.comm.offload": offload} if offload else {}):
            if opts.module == "numpy":
                from distributed import Client, LocalCluster

                with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol="tcp",
                                  dashboard_address=None) as cluster, Client(cluster) as client:
                    return _worker_moves(client, opts)
            from spillway.launch import open_cluster
            from spillway.options.settings import Options

            options = Options.resolve(devices=opts.device, workers_per_gpu=2, dashboard_address=None)
            with open_cluster(options) as session:
                return _worker_moves(session.client, opts)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def summarize(steps: list[dict]) -> list[dict]:
    """Per size, the median of each step over the timed transfers (warm-ups left out)."""
    out = []
    for nbytes in dict.fromkeys(s["bytes"] for s in steps):
        timed = [s for s in steps if s["bytes"] == nbytes and not s["warm_up"]]
        names = [k for k in dict.fromkeys(k for s in timed for k in s)
                 if k not in ("bytes", "warm_up", "same_bits", "threads")]
        medians = {}
        for name in names:
            values = [s[name] for s in timed if s.get(name) is not None]
            medians[name] = statistics.median(values) if values else None
        seen: dict[str, set] = {}
        for s in timed:
            for what, name in s.get("threads", {}).items():
                seen.setdefault(what, set()).update({name} - {None})
        threads = {what: sorted(names) for what, names in seen.items()}
        out.append({"bytes": nbytes, "ms": medians, "same_bits": all(s["same_bits"] for s in timed),
                    "repeats": len(timed), **({"threads": threads} if threads else {})})
    return out


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n < 2**30 else f"{n / 2**30:g} GiB"


def table(result: dict) -> str:
    """Total ms per row and size, then each row's steps (median ms)."""
    sizes = result["sizes"]
    lines = [f"transfer anatomy ({result['scheme']}, {result['module']}): median ms of {result['repeats']}",
             f"{'row':<20} | " + " | ".join(f"{_size(n):>9}" for n in sizes)]
    for row, r in result["rows"].items():
        if "error" in r:
            lines.append(f"{row:<20} | {r['error'][:100]}")
            continue
        by = {s["bytes"]: s for s in r["summary"]}
        cells = []
        for n in sizes:
            s = by.get(n)
            total = s and s["ms"].get("total")
            cells.append("-" if total is None else f"{total:.3f}" + ("" if s["same_bits"] else "!"))
        lines.append(f"{row:<20} | " + " | ".join(f"{c:>9}" for c in cells))
    for row, r in result["rows"].items():
        if "error" in r:
            continue
        lines.append(f"\n{row}: steps (median ms)")
        by = {s["bytes"]: s for s in r["summary"]}
        names = list(dict.fromkeys(k for s in r["summary"] for k in s["ms"] if k != "total"))
        for name in names:
            cells = [by[n]["ms"].get(name) if n in by else None for n in sizes]
            lines.append(f"  {name:<40} | " + " | ".join(f"{'-' if c is None else f'{c:.3f}':>9}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spillway_bench.transfer_anatomy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--rows", default=None, help=f"comma-separated, of {', '.join(GPU_ROWS)}")
    parser.add_argument("--device", default="0", help="the GPU both processes share")
    parser.add_argument("--cpu", action="store_true", help="tcp:// and NumPy arrays: the stand-in without a GPU")
    parser.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    parser.add_argument("--pool", type=int, default=None,
                        help="bytes of each probe process's RMM pool (default 4x the largest size "
                             "+ 256 MiB; 0: no pool)")
    # the probe's own processes
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("sender", "receiver"), help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--scheme", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--module", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sizes = _parse_sizes(args.sizes)
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} is below the minimum of 1")
    if args.child:
        _child(args)
        return 0
    args.scheme = "tcp" if args.cpu else "ucx"
    args.module = "numpy" if args.cpu else "cupy"
    if args.pool is None:
        args.pool = 0 if args.cpu else 4 * max(args.sizes) + 2**28
    rows = tuple(r.strip() for r in args.rows.split(",")) if args.rows else (CPU_ROWS if args.cpu else GPU_ROWS)
    unknown = [r for r in rows if r not in GPU_ROWS]
    if unknown:
        parser.error(f"--rows: {unknown[0]!r} is not one of {', '.join(GPU_ROWS)}")
    result = {"what": "transfer anatomy", "scheme": args.scheme, "module": args.module, "sizes": args.sizes,
              "repeats": args.repeats, "pool": args.pool,
              "env": {k: v for k, v in os.environ.items()
                      if k.startswith(("UCX_", "UCXPY_", "DASK_DISTRIBUTED"))}, "rows": {}}
    for row in rows:
        started = time.perf_counter()
        print(f"== {row}", file=sys.stderr, flush=True)
        env = {**os.environ, **ROW_ENV.get(row, {})}
        if not args.cpu:  # both processes of a pair on the one GPU, with the workers' transports
            from .ceilings import physical

            env["CUDA_VISIBLE_DEVICES"] = physical((args.device,))[0]
            if "UCX_TLS" not in os.environ:
                env.update(GPU_TRANSPORTS.get(row.split("-")[0], {}))
        try:
            if row.startswith("raw") and args.cpu:
                import importlib.util

                if importlib.util.find_spec("ucxx") is None:
                    raise RuntimeError("ucxx is not installed")
            found = _workers(row, args) if row.startswith("workers") else _pair(row, args, env)
            result["rows"][row] = {**found, "summary": summarize(found["steps"]),
                                # what this row's processes ran with beside this one's environment
                                "env": {k: v for k, v in env.items() if os.environ.get(k) != v}}
        except Exception as e:  # one row's failure leaves the others' figures
            result["rows"][row] = {"error": f"{type(e).__name__}: {e}"}
            print(f"== {row} failed: {result['rows'][row]['error']}", file=sys.stderr, flush=True)
        result["rows"][row]["seconds"] = time.perf_counter() - started
        if args.out:  # after each row: a later row that hangs past the caller's timeout keeps these
            with open(args.out, "w") as f:
                f.write(json.dumps(result) + "\n")
    if not args.out:
        print(json.dumps(result))
    print(table(result))
    failed = [r for r in result["rows"].values()
              if "error" in r or not all(s["same_bits"] for s in r["summary"])]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
