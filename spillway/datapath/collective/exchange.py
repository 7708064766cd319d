"""The collective's tasks as they run on the workers: cut, barrier, assemble.

- :func:`cut` (one task per input chunk) cuts its chunk into the piece each output chunk
  needs and keeps the pieces in its worker's store under keys of their own
  (``(pieces name, input, output)``): counted, spilled to host and disk like any value.
  It returns its worker's address.
- :func:`barrier` (one per partial) waits for every cut of its partial and returns where
  each input's pieces are. The scheduler plugin (:mod:`.spread`) spreads the outputs
  over the workers as it ends.
- :func:`assemble` (one task per output chunk) takes its pieces from every worker that
  holds some, in one request per worker, all at once (the data plane where both ends have
  it: device to device, received into the RMM pool; the worker's comm otherwise), and
  writes them into the output chunk on the device. Pieces stay where they are (a grouped
  exchange's buffers: on the worker they were moved to) until the exchange's barrier is
  released, as the barrier's result stands for them: dask may run an assembly again while
  it holds the barrier (an output lost, or asked for again by another graph). Then the
  scheduler's plugin tells the workers to drop them.

A worker lost once the cuts are done takes pieces with it that nothing can make again
without the whole exchange: the assembly that needs them fails with
:class:`CollectiveLost`, one line naming the worker, and the computation with it.

What the tasks keep between them on a worker (each exchange's layout and first-assembly
lock, the phases' times) is the worker's :class:`~.state.CollectiveState`, in the worker
plugin the first of them adds (:mod:`.plugin`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict

from spillway.options.errors import SpillwayError
from spillway.upstream import log_incoming
from .copies import Batch, Flat, view_of
from .layout import PieceLayout, flat_index, owned_parts, packing, plan_of
from spillway.datapath.on_worker import keep, on_loop, plugin_of
from .state import LOCAL, WORKER_PLUGIN, CollectiveState, state_of

logger = logging.getLogger("spillway.collective")

#: worker handlers: take pieces (the comm path) and drop a collective's leftovers
TAKE = "spillway_collective_take"
DROP = "spillway-collective-drop"
#: seconds an assembly keeps asking a holder that answers busy
BUSY_PATIENCE_S = 120.0

PIECES = "spillway_collective_pieces"


class CollectiveLost(SpillwayError, RuntimeError):
    """Pieces of an exchange are gone with their worker: the exchange cannot finish."""


def _worker():
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _tiered(worker):
    """The worker's tiered store, None where it keeps another (distributed's, dask-cuda's)."""
    from spillway.memory.store import TieredStore

    data = worker.data
    return data if isinstance(data, TieredStore) else None


def _mark_made(worker, kept: dict) -> None:
    """The pieces' copies run asynchronously on the device, and a holder may send them
    (over UCX, on streams of its own) as soon as this task returns. Where the worker has a
    data plane, its serve waits for each key's producer event, as it does for a task's
    output: the cut returns at once. The comm path synchronizes the device before it
    sends (distributed-ucxx does); a CPU worker's copies are done."""
    first = next(iter(kept.values()))
    if not type(first).__module__.startswith("cupy"):
        return
    import cupy

    from spillway.datapath.plane.hook import plane_of

    plane = plane_of(worker)
    if plane is None or not plane.gpu:
        cupy.cuda.get_current_stream().synchronize()
        return
    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(cupy.cuda.get_current_stream())
    for key in kept:
        plane.produced[key] = event


def _forget_made(worker, key) -> None:
    from spillway.datapath.plane.hook import plane_of

    plane = plane_of(worker)
    if plane is not None:
        plane.released(key)


def cut(block, name: str, index: tuple, chunks: tuple, partial: int) -> str | None:
    """Cut input chunk ``index`` of the rechunk ``chunks`` (old, new) into the pieces its
    partial's outputs need and keep them here: packed one buffer a worker where the
    exchange is grouped (:mod:`.layout`), one value a piece otherwise."""
    old, new = chunks
    plan = plan_of(old, new)
    in_grid, out_grid = tuple(map(len, old)), tuple(map(len, new))
    i = flat_index(index, in_grid)
    worker = _worker()
    state = _state(worker) if worker is not None else None
    began = time.perf_counter()
    layout = _layout(worker, state, name, plan, partial, block, out_grid) if worker is not None else None
    asked = time.perf_counter()
    xp = _module(block)
    grouped = layout is not None and layout.grouped
    # what fixes every copy of this cut: the next run of the same rechunk reuses them
    batch = Batch(block.dtype.itemsize, key=("cut", old, new, index, len(layout.workers) if grouped else 0,
                                            block.strides, block.dtype.itemsize))
    kept = {}
    if grouped:
        for d, (total, pieces) in packing(old, new, index, len(layout.workers)).items():
            buffer = kept[(name, "g", i, d)] = xp.empty(total, dtype=block.dtype)
            for offset, shape, src in pieces.values():
                batch.add(block, src, buffer, Flat(offset, shape))
    else:
        for j, src in plan.pieces_of(index):
            piece = kept[(name, i, flat_index(j, out_grid))] = xp.empty(_extent(src), dtype=block.dtype)
            batch.add(block, src, piece, _whole(piece))
    planned = time.perf_counter()
    batch.run()
    if worker is None:
        LOCAL.run(name).pieces.update(kept)
        return None
    if kept:
        _mark_made(worker, kept)
    cut_at = time.perf_counter()
    keep(worker, kept)
    stats = state.phases
    stats.add("layout", asked - began)
    stats.add("cut_plan", planned - asked)
    stats.add("cut_launch", cut_at - planned)
    stats.add("cut_store", time.perf_counter() - cut_at)
    return worker.address


def direct(blocks: list, places: list, shape: tuple):
    """An output chunk of a partial that only splits or merges: ``blocks[k][src]`` at
    ``dst`` for each ``(src, dst)`` of ``places``."""
    if len(blocks) == 1 and _extent(places[0][0]) == tuple(shape):
        return blocks[0][places[0][0]]
    return _joined([(b, src) for b, (src, _) in zip(blocks, places)], [dst for _, dst in places], shape)


def barrier(name: str, inputs: list, *holders) -> dict:
    """Every cut of a partial is done: where each input's pieces are (input index -> its
    worker), and the layout the cuts packed them by, for the assemblies (a worker's cache
    of layouts may be another run's of the same exchange)."""
    worker = _worker()
    layout = None
    if worker is not None:
        run = _state(worker).find(name)
        found = None if run is None else run.layout
        layout = None if found is None else [list(found.workers), found.grouped]
    return {"holders": dict(zip(inputs, holders)), "layout": layout}


def assemble(ended: dict, name: str, index: tuple, chunks: tuple, partial: int):
    """Output chunk ``index`` from its pieces, taken from where its barrier (``ended``)
    says they are."""
    old, new = chunks
    plan = plan_of(old, new)
    shape = plan.output_shape(index)
    parts = plan.parts_of(index)
    worker = _worker()
    holders = ended["holders"]
    layout = None
    if worker is not None:
        state = _state(worker)
        if ended["layout"] is not None:
            layout = PieceLayout(tuple(ended["layout"][0]), bool(ended["layout"][1]))
        else:  # the barrier ran where no cut of its exchange did
            layout = on_loop(worker, _ask_layout, worker, state, name, 0, tuple(map(len, new)))
    gathering = time.perf_counter()
    if layout is not None and layout.grouped:
        d = layout.owner(index, tuple(map(len, new)))

        def request() -> dict:
            return {"name": name, "index": list(index), "chunks": [list(map(list, old)), list(map(list, new))],
                    "partial": partial, "holders": [[list(k), v] for k, v in holders.items()],
                    "layout": [list(layout.workers), layout.grouped]}

        if layout.workers[d] == worker.address:
            pieces = _owned_on_device(worker, name, index, old, new, layout)
            if pieces is None:  # the first assembly here takes the buffers (on the loop)
                pieces = on_loop(worker, _owned_pieces, worker, request())
        else:  # the owner left, or dask placed this elsewhere: the owner hands them over
            pieces = on_loop(worker, _pieces_from_owner, worker, layout.workers[d], request())
        sources = [pieces[i] for i, _ in parts]
        # views of the buffers packed for this worker, or whole arrays handed over
        owned = layout.workers[d] == worker.address
        key = ("join", old, new, index, len(layout.workers) if owned else tuple(a.strides for a, _ in sources),
               str(sources[0][0].dtype))
    else:
        in_grid, out_grid = tuple(map(len, old)), tuple(map(len, new))
        j = flat_index(index, out_grid)
        keys = [(name, flat_index(i, in_grid), j) for i, _ in parts]
        if worker is None:
            values = _local_pieces(name, keys)
        else:
            by_holder: dict = defaultdict(list)
            for (i, _), key in zip(parts, keys):
                by_holder[holders[i]].append(key)
            # the holders keep them until the exchange ends: dask may run an assembly again
            # (an output lost, or asked for again while the barrier is held)
            taken = on_loop(worker, _take_all, worker, dict(by_holder), False)
            values = [taken[k] for k in keys]
        sources = [(v, _whole(v)) for v in values]
        key = ("join", old, new, index, tuple(v.strides for v in values), str(values[0].dtype))
    if len(parts) == 1 and _extent_of(sources[0]) == tuple(shape):
        return view_of(*sources[0])  # the whole output chunk in one piece: no copy
    joined_at = time.perf_counter()
    out = _joined(sources, [dst for _, dst in parts], shape, key)
    if worker is not None:  # the kernel's launch: it runs on while the next task starts
        stats = state.phases
        stats.add("pieces", joined_at - gathering)
        stats.add("join", time.perf_counter() - joined_at)
    return out


def _local_pieces(name: str, keys: list) -> list:
    """The pieces cut without a distributed worker, taken: the exchange's run goes with
    its last piece (no scheduler tells a local run that its exchange ended)."""
    run = LOCAL.find(name)
    pieces = run.pieces if run is not None else {}
    values = [pieces.pop(k) for k in keys]
    if not pieces:
        LOCAL.drop(name)
    return values


def _axes_from_wire(axes: list) -> tuple:
    """A plan's chunks as a message brought them (lists): tuples again, an axis of
    windows as ``(start, stop)`` pairs (:func:`~.plan.windows_of`)."""
    return tuple(tuple(tuple(c) if isinstance(c, list) else c for c in axis) for axis in axes)


def _extent(index: tuple) -> tuple:
    return tuple(s.stop - s.start for s in index)


def _extent_of(source) -> tuple:
    array, at = source
    return tuple(at.shape) if isinstance(at, Flat) else _extent(at)


def _whole(array) -> tuple:
    return tuple(slice(0, n) for n in array.shape)


# --- grouped exchanges: the owner's buffers


def _layout(worker, state: CollectiveState, name: str, plan, partial: int, block, grid: tuple):
    run = state.find(name)
    if run is not None and run.layout is not None:
        return run.layout
    nbytes = sum(math.prod(plan.input_shape(i)) for i in plan.partials[partial].inputs) * block.dtype.itemsize
    return on_loop(worker, _ask_layout, worker, state, name, nbytes, grid)


async def _ask_layout(worker, state: CollectiveState, name: str, nbytes: int, grid: tuple):
    """The exchange's layout, from the scheduler (the same answer to every worker);
    ungrouped where the scheduler has no collective plugin."""
    try:
        answer = await worker.scheduler.spillway_collective_layout(name=name, nbytes=nbytes, grid=list(grid))
    except Exception:  # noqa: BLE001 (no plugin on this scheduler: pieces, not groups)
        answer = None
    layout = PieceLayout(tuple(answer["workers"]), bool(answer["grouped"])) if answer else PieceLayout((), False)
    state.run(name).layout = layout
    return layout


def _owned_on_device(worker, name: str, index: tuple, old: tuple, new: tuple, layout: PieceLayout) -> dict | None:
    """:func:`_owned_pieces` without the event loop, where every buffer it needs is on this
    worker's device (or held as it is) already, as for each assembly after the first:
    read from the tiered store, which is safe from any thread; None where one is not
    (another store, another tier, not taken yet), for the loop to take or restore it."""
    store = _tiered(worker)
    if store is None:
        return None
    try:
        # a CPU worker's buffers are plain values: at hand too
        return _owned_views(worker, name, index, old, new, layout, held=store.in_memory)
    except KeyError:  # dropped meanwhile: the loop's path says why
        return None


def _owned_views(worker, name: str, index: tuple, old: tuple, new: tuple, layout: PieceLayout,
                 held=None) -> dict | None:
    """Input index -> (the buffer packed for this worker, where its piece of output chunk
    ``index`` lies in it); None where ``held`` says a buffer is not at hand."""
    d = layout.workers.index(worker.address)
    out = {}
    for i, flat, offset, shape in owned_parts(old, new, index, len(layout.workers), d):
        key = (name, "g", flat, d)
        if held is not None and not held(key):
            return None
        out[i] = (worker.data[key], Flat(offset, shape))
    return out


async def _owned_pieces(worker, request: dict) -> dict:
    """The pieces of one output chunk that this worker assembles, as views of the
    buffers packed for it (the first assembly of an exchange here takes every buffer
    packed for this worker from its holder: one request per holder); the buffers stay
    until the exchange ends."""
    name, partial = request["name"], request["partial"]
    index = tuple(request["index"])
    old, new = (_axes_from_wire(c) for c in request["chunks"])
    holders = {tuple(k): v for k, v in request["holders"]}
    plan = plan_of(old, new)
    layout = PieceLayout(tuple(request["layout"][0]), bool(request["layout"][1]))
    d = layout.workers.index(worker.address)
    in_grid = tuple(map(len, old))
    inputs = plan.partials[partial].inputs
    workers = len(layout.workers)
    # the inputs that packed a buffer for this worker (an input none of whose pieces go
    # to this worker's outputs packed none)
    keys = {i: (name, "g", flat_index(i, in_grid), d) for i in inputs if d in packing(old, new, i, workers)}
    state = state_of(worker)
    async with state.run(name).first_assembly:
        missing: dict = defaultdict(list)
        for i, key in keys.items():
            if key not in worker.data:
                missing[holders[i]].append(key)
        if missing:
            # moved here: this worker is where dask runs every assembly of them again
            taken = await _take_all(worker, dict(missing), True)
            stored = time.perf_counter()
            for key, value in taken.items():
                worker.data[key] = value
            state.phases.add("owned_store", time.perf_counter() - stored)
    return _owned_views(worker, name, index, old, new, layout)


async def _pieces_from_owner(worker, owner: str, request: dict) -> dict:
    try:
        response = await worker.rpc(owner).spillway_collective_pieces(request=request)
    except OSError as e:
        raise CollectiveLost(_lost_line([(request["name"], None, request["index"])], owner,
                                        f"the worker is gone ({type(e).__name__})")) from None
    return {tuple(k): (v, _whole(v)) for k, v in response}


def _joined(sources: list, places: list, shape: tuple, key=None):
    """The output chunk of ``shape`` from ``sources`` (each an array and the part of it
    that is the piece: slices or :class:`~.copies.Flat`) written at ``places`` (slices),
    into one allocation with one launch (:mod:`.copies`; ``key``: what fixes the copies,
    as a :class:`~.copies.Batch` takes it)."""
    first = sources[0][0]
    out = _module(first).empty(shape, dtype=first.dtype)
    batch = Batch(first.dtype.itemsize, key=key)
    for (array, at), place in zip(sources, places):
        batch.add(array, at, out, place)
    batch.run()
    return out


def _module(array):
    if type(array).__module__.startswith("cupy"):
        import cupy

        return cupy
    import numpy

    return numpy


# --- on the worker's event loop


def _state(worker) -> CollectiveState:
    """The worker's collective state, its plugin and the holder's handlers added by the
    first collective task here (:mod:`spillway.datapath.on_worker`)."""
    return plugin_of(worker, WORKER_PLUGIN, _plugin).state


def _plugin(worker):
    from .plugin import CollectiveWorker

    plugin = CollectiveWorker()
    return (plugin, {TAKE: _take_handler(worker), PIECES: _pieces_handler(worker)},
            {DROP: _drop_handler(worker, plugin.state)})


async def _take_all(worker, by_holder: dict, move: bool) -> dict:
    """Every piece of ``by_holder`` (address -> keys), from all holders at once; ``move``:
    the holders drop what they sent (else they keep it until the exchange ends)."""
    began = time.perf_counter()
    results = await asyncio.gather(*(_take(worker, holder, keys, move) for holder, keys in by_holder.items()))
    state_of(worker).phases.add("take", time.perf_counter() - began)
    values: dict = {}
    for found in results:
        values.update(found)
    return values


async def _take(worker, holder: str, keys: list, move: bool) -> dict:
    if holder == worker.address:
        return _here(worker, keys, holder, move)
    deadline = time.monotonic() + BUSY_PATIENCE_S
    delay = 0.001
    while True:
        start = time.time()
        try:
            response = await _fetch(worker, holder, keys, move)
        except OSError as e:  # distributed's CommClosedError is one: the holder is gone
            raise CollectiveLost(_lost_line(keys, holder, f"the worker is gone ({type(e).__name__})")) from None
        if response.get("status") == "OK":
            data = response["data"]
            missing = [k for k in keys if k not in data]
            if missing:
                raise CollectiveLost(_lost_line(missing, holder, "its pieces are gone (the worker restarted, "
                                                                 "or the exchange was stopped)"))
            _log_incoming(worker, holder, data, start)
            return data
        if time.monotonic() > deadline:
            raise CollectiveLost(_lost_line(keys, holder, f"it answered busy for {BUSY_PATIENCE_S:.0f} s"))
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


async def _fetch(worker, holder: str, keys: list, move: bool) -> dict:
    """The data plane where both ends have one (then, moving, the holder is told to drop
    what it sent), the worker's comm otherwise."""
    from spillway.datapath.plane.hook import plane_of

    plane = plane_of(worker)
    stats = state_of(worker).phases
    began = time.perf_counter()
    if plane is not None and await plane.reaches(holder):
        response = await plane.fetch(holder, keys)
        if response is not None:
            if move and response.get("status") == "OK":
                _drop_later(worker, holder, keys)
            stats.add("take_plane", time.perf_counter() - began)
            return response
    response = await worker.rpc(holder).spillway_collective_take(keys=keys, keep=not move)
    stats.add("take_comm", time.perf_counter() - began)
    return response


def _log_incoming(worker, holder: str, data: dict, start: float) -> None:
    """The move in the worker's incoming transfer log, as a gather's (the bench and the
    dashboard read bytes moved there)."""
    sizes = {k: int(getattr(v, "nbytes", 0)) for k, v in data.items()}
    state_of(worker).phases.taken_bytes += sum(sizes.values())
    log_incoming(worker, holder, sizes, start, time.time())


def _drop_later(worker, holder: str, keys: list) -> None:
    async def drop():
        try:
            await worker.rpc(holder).spillway_collective_take(keys=keys, send=False)
        except OSError:
            pass  # the holder is gone, and its pieces with it

    pending = state_of(worker).pending
    task = asyncio.ensure_future(drop())
    pending.add(task)
    task.add_done_callback(pending.discard)


def _here(worker, keys: list, holder: str, move: bool) -> dict:
    missing = [k for k in keys if k not in worker.data]
    if missing:
        raise CollectiveLost(_lost_line(missing, holder, "its pieces are gone (the exchange was stopped)"))
    return {k: _pop_value(worker.data, k, worker) if move else worker.data[k] for k in keys}


def _pop_value(data, key, worker=None):
    # distributed's SpillBuffer (CPU workers) refuses ``pop``: it would read a spilled value
    # back only to drop it
    value = data[key]
    del data[key]
    if worker is not None:
        _forget_made(worker, key)
    return value


def _lost_line(keys: list, holder: str, why: str) -> str:
    name, j = keys[0][0], keys[0][-1]
    return (f"rechunk exchange {name.removeprefix('spillway-pieces-')[:12]}: output chunk {j} cannot get "
            f"{len(keys)} piece(s) from worker {holder}: {why}; the computation stops (a worker lost "
            f"mid-exchange takes pieces only the whole exchange could make again)")


# --- the holder's side: handlers added with the worker's plugin (:func:`_plugin`)


def _take_handler(worker):
    async def take(keys=(), send=True, keep=False):
        from distributed.protocol import to_serialize

        keys = [tuple(k) if isinstance(k, list) else k for k in keys]
        if not send:  # the data plane sent them: only drop them
            for k in keys:
                if k in worker.data:
                    del worker.data[k]
                _forget_made(worker, k)
            return None
        present = [k for k in keys if k in worker.data]
        data = {k: worker.data[k] if keep else _pop_value(worker.data, k, worker) for k in present}
        return {"status": "OK", "data": {k: to_serialize(v) for k, v in data.items()}}

    return take


def _pieces_handler(worker):
    async def pieces(request=None):
        from distributed.protocol import to_serialize

        found = await _owned_pieces(worker, request)
        return [[list(i), to_serialize(view_of(*v))] for i, v in found.items()]

    return pieces


def _drop_handler(worker, state: CollectiveState):
    def drop(name=None, **_):
        """What an exchange left here once it ended (stopped, failed or cancelled): its
        pieces in the store and its run."""
        left = [k for k in list(worker.data) if type(k) is tuple and k and k[0] == name]
        for key in left:
            if key in worker.data:
                del worker.data[key]
            _forget_made(worker, key)
        state.drop(name)
        if left:
            logger.info("dropped %d piece(s) an exchange left on %s", len(left), worker.address)

    return drop
