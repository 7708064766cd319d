"""A rechunk as a collective, as a dask array: one cut a input chunk, one barrier a
partial, one assembly an output chunk (:mod:`.exchange`), so the task count grows with
the chunks, not with chunks x chunks as dask's task-based rechunk does. A map_overlap's
halos take the same path (:func:`overlap_internal`): each grown chunk is an assembly of its
neighbours' faces, where dask makes a task of every face, edge and corner."""

from __future__ import annotations

import itertools
import math

from spillway.upstream import task_ref, unfused_task
from .exchange import assemble, barrier, cut, direct
from .layout import plan_of
from .names import BARRIER_PREFIX, CUT_PREFIX, OUTPUT_PREFIX, pieces_name
from .plan import ExchangePlan
from .way import TASKS, cluster_room, way


def rechunk(x, chunks, *, plan: ExchangePlan | None = None, room: dict | None = None):
    """``x`` rechunked to ``chunks`` (anything ``dask.array.rechunk`` takes), through the
    collective where pieces of several inputs meet in several outputs and they fit the
    workers' fastest tier beside what the cluster holds (``room``, asked of the default
    client's scheduler where not given: :mod:`.way`); a rechunk that only splits or only
    merges chunks, or would not fit, is dask's own."""
    from dask.base import tokenize

    if not exchangeable(x):
        return x.rechunk(chunks, method="tasks")
    chunks = _normalized(x, chunks)
    if chunks == x.chunks:
        return x
    plan = plan or plan_of(x.chunks, chunks)
    if not plan.exchanges or not plain_chunks(x):
        return x.rechunk(chunks, method="tasks")
    room = room if room is not None else cluster_room()
    if not _fits(x, plan, room):
        return x.rechunk(chunks, method="tasks")
    return _exchange(x, (x.chunks, chunks), chunks, plan, tokenize(x, chunks), room)


def overlap_internal(x, axes: dict, *, fallback, room: dict | None = None, plan: ExchangePlan | None = None):
    """``dask.array.overlap.overlap_internal(x, axes)`` (each chunk grown by its
    neighbours' faces, ``axes[d]`` elements a side along axis ``d``, or ``(left, right)``)
    as one exchange: a cut an input chunk, an assembly an output chunk, its pieces from
    each neighbour's worker in one request per peer, where that fits the workers' fastest
    tier (:mod:`.way`); else ``fallback(x, axes)``: dask's own (a getitem a face, edge and
    corner and a concatenation a chunk), which the caller holds where it routed dask's
    name here (:mod:`.method`). The same blocks, bit for bit. ``plan``: the windows'
    plan where the caller made it already."""
    from dask.base import tokenize

    if not exchangeable(x):
        return fallback(x, axes)
    windows = overlap_windows(x.chunks, axes)
    plan = plan or plan_of(x.chunks, windows)
    if not plan.exchanges or not plain_chunks(x):
        return fallback(x, axes)
    room = room if room is not None else cluster_room()
    if not _fits(x, plan, room):
        return fallback(x, axes)
    return _exchange(x, (x.chunks, windows), plan.sizes, plan, tokenize(x, axes, "overlap"), room)


def _fits(x, plan: ExchangePlan, room: dict | None) -> bool:
    """Whether the exchanging chunks of ``plan`` fit the workers' fastest tiers beside
    what the cluster holds (``room``, asked of the default client's scheduler where not
    given: :mod:`.way`)."""
    exchanged = sum(math.prod(plan.input_shape(i)) for p in plan.partials if p.exchanges
                    for i in p.inputs) * x.dtype.itemsize
    if room and made_from_held(x):
        # an ``x`` made from a persisted array is held beside the pieces cut from it,
        # whether or not the scheduler holds it yet: a user's map_overlap built right after
        # ``persist`` (its chunks still being made; its boundary's pads make the ``x`` the
        # halos see) saw nothing held and took the exchange past the device, at twice dask's
        # own time. An ``x`` made in the graph goes as it is cut
        room = {**room, "held": max(room.get("held", 0), x.nbytes)}
    return way(exchanged, room) != TASKS


def made_from_held(x) -> bool:
    """Whether ``x`` is, or is made from, a client's persisted array: a layer of its graph
    is futures (read off the layers' kinds: a lazy graph is never materialized for this)."""
    layers = getattr(x.dask, "layers", None)
    return bool(layers) and any(futures_layer(layer) for layer in layers.values())


def futures_layer(layer) -> bool:
    """Whether a graph layer is a client's futures (what ``persist`` makes of a layer)."""
    if not layer.is_materialized():
        return False
    try:
        from distributed import Future
    except ImportError:
        return False
    return isinstance(next(iter(layer.values()), None), Future)


def exchangeable(x) -> bool:
    """Whether ``x`` has elements and a known grid: an empty or 0-d array has nothing to
    exchange (dask's own special-cases it, and an exchange of no pieces has no worker to
    assemble on), and unknown chunk sizes give no plan (dask refuses or handles them
    itself)."""
    return x.ndim > 0 and not any(math.isnan(c) for axis in x.chunks for c in axis) and x.size > 0


def plain_chunks(x) -> bool:
    """Whether ``x``'s chunks are plain NumPy or CuPy arrays, which a cut copies into
    arrays of their own kind; a masked, sparse or other array's chunks keep dask's way,
    which slices them as they are."""
    from dask.array.utils import meta_from_array

    kind = type(meta_from_array(x))
    return kind.__name__ == "ndarray" and kind.__module__.split(".")[0] in ("numpy", "cupy")


def overlap_windows(chunks: tuple, axes: dict) -> tuple:
    """Each axis' output windows of an overlap (``(start, stop)`` of every grown chunk), as
    ``dask.array.overlap._overlap_internal_chunks`` sizes them: a chunk takes ``left``
    elements of the chunk before it and ``right`` of the one after, none past the array's
    ends, and an axis of one chunk is left as it is."""
    out = []
    for d, axis in enumerate(chunks):
        depth = axes.get(d, 0)
        left, right = depth if isinstance(depth, tuple) else (depth, depth)
        bounds = [0, *itertools.accumulate(axis)]
        if len(axis) == 1:
            out.append(((0, bounds[-1]),))
            continue
        out.append(tuple((max(0, bounds[k] - left), min(bounds[-1], bounds[k + 1] + right))
                         for k in range(len(axis))))
    return tuple(out)


def _exchange(x, spec: tuple, chunks: tuple, plan: ExchangePlan, token: str, room: dict | None):
    """The exchange's layers of ``plan`` over ``x``: output chunks of sizes ``chunks``;
    ``spec`` is what each task rebuilds the plan from (input chunks, output chunks or
    windows). One step a worker (:mod:`spillway.datapath.step`) where the option
    ``exchange`` says so and the cluster's scheduler coordinates steps, or where there is
    no cluster (one step does it all); the pieces' tasks otherwise."""
    from dask.highlevelgraph import MaterializedLayer

    out_name = OUTPUT_PREFIX + token
    slots = step_slots(room)
    if slots:
        return _steps(x, spec, chunks, plan, token, room, slots)
    cut_name, barrier_name = CUT_PREFIX + token, BARRIER_PREFIX + token
    cuts, barriers = {}, {}
    outputs = _direct_outputs(x, plan, out_name)
    for p, partial in enumerate(plan.partials):
        if not partial.exchanges:
            continue
        barrier_key = (barrier_name, p)
        pieces = pieces_name(barrier_key)
        for index in partial.inputs:
            cuts[(cut_name, *index)] = (cut, (x.name, *index), pieces, index, spec, p)
        # the barrier and the assemblies keep their own keys through dask's low-level
        # fusion. A barrier left one assembly (a graph culled to some output chunks) would
        # be fused with it and the tasks after it, under a key the scheduler's plugin does
        # not take for a barrier (no placement, no drop of its pieces); and the last of
        # those tasks' key would name that fused task in one graph and the assembly and
        # those tasks alone in a graph culled otherwise: graphs computed in a row then hand
        # the scheduler one key for two tasks
        barriers[barrier_key] = unfused_task(barrier_key, barrier, pieces, list(partial.inputs),
                                             *[task_ref((cut_name, *i)) for i in partial.inputs])
        for index in partial.outputs:
            outputs[(out_name, *index)] = unfused_task((out_name, *index), assemble, task_ref(barrier_key), pieces,
                                                       index, spec, p)
    # the cuts' layer says the input's chunks: the capacity check counts each cut's pieces
    # as its input chunk's bytes (:mod:`spillway.memory.graph_bytes`)
    array_info = {"type": type(x), "chunks": x.chunks, "dtype": x.dtype}
    layers = {
        cut_name: MaterializedLayer(cuts, collection_annotations=array_info),
        barrier_name: MaterializedLayer(barriers),
        out_name: MaterializedLayer(outputs),
    }
    return _array(x, layers, {cut_name: None, barrier_name: {cut_name}, out_name: {barrier_name}}, out_name,
                  chunks, plan)


def _array(x, layers: dict, reads: dict, out_name: str, chunks: tuple, plan: ExchangePlan):
    """The array ``out_name`` of ``layers`` over ``x``'s graph. Each layer depends on
    exactly the layers its tasks read (HighLevelGraph.validate, which dask's assert_eq
    runs): ``reads`` says which of this exchange's layers each reads (None: the input's);
    the outputs read the input's chunks too where a partial splits or merges."""
    import dask.array as da
    from dask.array.utils import meta_from_array
    from dask.highlevelgraph import HighLevelGraph

    inputs = set(x.__dask_layers__())
    dependencies = {name: set(inputs if read is None else read) for name, read in reads.items()}
    if any(not partial.exchanges for partial in plan.partials):
        dependencies[out_name] |= inputs
    graph = HighLevelGraph.merge(x.dask, HighLevelGraph(layers, dependencies))
    return da.Array(graph, out_name, chunks, meta=meta_from_array(x))


def step_slots(room: dict | None) -> int:
    """How many steps an exchange takes: one a worker of a cluster whose scheduler
    coordinates steps (a spillway cluster of option ``exchange: step``), one where no
    cluster is about (dask's local schedulers, under the same option in this process's
    config); 0, the pieces' tasks, otherwise."""
    if room:
        return int(room.get("workers") or 0) if room.get("steps") else 0
    try:
        from distributed import default_client

        default_client()
    except (ImportError, ValueError):
        from spillway.options.settings import worker_value

        return 1 if worker_value("exchange") == "step" else 0
    return 0


def _direct_outputs(x, plan: ExchangePlan, out_name: str) -> dict:
    """The output chunks of the partials that only split or merge: each from its inputs as
    they are (a cut, a barrier and an assembly alone, or a step, would be fused into one
    task by dask, and leave what it kept behind with nothing to end it)."""
    outputs = {}
    for partial in plan.partials:
        if partial.exchanges:
            continue
        for index in partial.outputs:
            inputs, places = [], []
            for i, dst in plan.parts_of(index):
                src = next(src for j, src in plan.pieces_of(i) if j == index)
                inputs.append((x.name, *i))
                places.append((src, dst))
            outputs[(out_name, *index)] = (direct, inputs, places, plan.output_shape(index))
    return outputs


def _steps(x, spec: tuple, chunks: tuple, plan: ExchangePlan, token: str, room: dict | None, slots: int):
    from dask.highlevelgraph import MaterializedLayer

    from spillway.datapath.step.graph import held_by_steps, step_layers
    from spillway.datapath.step.layout import rounds_for
    from spillway.datapath.step.names import STEP_PREFIX

    out_name = OUTPUT_PREFIX + token
    old, new = spec
    rounds = rounds_for(old, new, slots, x.dtype.itemsize, _round_bytes(room))
    steps, getters = step_layers(x, new, plan, token, out_name, slots, rounds)
    outputs = {**getters, **_direct_outputs(x, plan, out_name)}
    step_name = STEP_PREFIX + token
    layers = {step_name: MaterializedLayer(steps, collection_annotations=held_by_steps(x, new, plan, slots)),
              out_name: MaterializedLayer(outputs)}
    return _array(x, layers, {step_name: None, out_name: {step_name}}, out_name, chunks, plan)


def _round_bytes(room: dict | None) -> int:
    """The option ``exchange-round-bytes``; ``auto``: a quarter of the smallest worker's
    fastest tier where the cluster says (else one round)."""
    from spillway.options.settings import worker_value

    value = worker_value("exchange_round_bytes")
    if value == "auto":
        smallest = (room or {}).get("smallest")
        return int(smallest) // 4 if smallest else 0
    return int(value)


def _normalized(x, chunks):
    from dask.array.core import normalize_chunks

    if isinstance(chunks, dict):
        chunks = tuple(chunks.get(d, chunks.get(d - x.ndim, x.chunks[d])) for d in range(x.ndim))
    chunks = tuple(x.chunks[d] if c is None else c for d, c in enumerate(chunks))
    return normalize_chunks(chunks, x.shape, dtype=x.dtype, previous_chunks=x.chunks)
