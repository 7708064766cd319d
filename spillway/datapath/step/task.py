"""An exchange's tasks as they run: :func:`step`, one a worker, and :func:`take`, one an
output chunk.

A step takes its slot's input chunks (:mod:`.layout`), leaves the worker's thread pool
(``secede``: a peer's inputs may still have to be made on this worker) and joins its
peers through the scheduler (:mod:`.coordinator`), which answers once every step of the
exchange has joined, with the transport they share and each peer's address there. Then,
round by round: it posts its receives (a message that is one C-contiguous run of an output
chunk straight into it, the rest into one buffer a peer), cuts every peer's pieces of its
inputs into one buffer a peer (one launch) and sends them, cuts its own pieces straight
into its outputs while they move (one launch), waits, and joins what landed in buffers (one
launch); the round's outputs go into the worker's store, counted and spillable, before the
next round allocates. Nothing of it passes the worker's event loop but the rendezvous and
the stores of other stores than spillway's.

Over CUDA IPC (:mod:`.ipc`, GPU workers of one host) a round sends nothing: it allocates
its outputs, publishes where they lie at a meeting of the steps on the scheduler, and one
kernel writes every piece of its inputs into the output it lands in, this worker's or a
peer's mapped here; a second meeting says every kernel ended (:func:`_exchange_put`).

Where a worker leaves mid-exchange the scheduler ends the attempt: every step still
running leaves its round and joins the next attempt, and dask reruns the steps that had
finished (each output's getter depends on every step). An exchange that cannot be made
again fails with :class:`~spillway.datapath.collective.CollectiveLost`, one line.

:func:`take` is an output chunk: its step's output, moved from the store to the key dask
asked for (from its holder where dask ran it elsewhere).
"""

from __future__ import annotations

import logging
import time

from spillway.datapath.collective.copies import Batch, Flat
from spillway.datapath.collective.exchange import CollectiveLost
from spillway.datapath.collective.layout import flat_index, plan_of
from spillway.datapath.on_worker import keep, on_loop, plugin_of
from spillway.upstream import log_incoming
from .layout import step_layout
from .state import LOCAL_LOCK, LOCAL_OUTPUTS, WORKER_PLUGIN, StepState, state_of
from .transport import EXCHANGE_BITS, PUT_KINDS, StepAborted, TransportError, offered, tag_of, wait

logger = logging.getLogger("spillway.step")

#: the scheduler's handler steps join at (:mod:`.coordinator`); a worker's handler a
#: getter takes an output held elsewhere from
JOIN = "spillway_step_join"
GIVE = "spillway_step_give"
#: the scheduler's handler the steps of a put kind meet at, twice a round (:mod:`.coordinator`)
MEET = "spillway_step_meet"
#: seconds a round may wait for its transfers with no word from the scheduler: a peer
#: that dies is reported long before (the scheduler ends the attempt)
ROUND_DEADLINE_S = 600.0


def step(name: str, slot: int, spec: tuple, *blocks) -> dict:
    """The step of slot ``slot`` of the exchange ``name``: ``spec`` is ``(old chunks, new
    chunks or windows, slots, rounds, dtype, array module)``, ``blocks`` the slot's input
    chunks in :attr:`~.layout.StepLayout.inputs_of` order."""
    old, new, slots, rounds, dtype, module = spec
    layout = step_layout(old, new, slots, rounds)
    inputs = dict(zip(layout.inputs_of.get(slot, ()), blocks))
    if blocks:
        # the chunks' own kind: an array's meta may say NumPy over CuPy chunks
        module = "cupy" if type(blocks[0]).__module__.startswith("cupy") else "numpy"
        spec = (old, new, slots, rounds, dtype, module)
    worker = _worker()
    if worker is None:
        return _local(name, old, new, layout, inputs, dtype, module)
    began = time.perf_counter()
    state = _state(worker)
    from distributed import secede

    secede()
    seen, failed = -1, None
    offers = _offers(worker, state, module)
    while True:
        asked = time.perf_counter()
        answer = on_loop(worker, _join, worker, name, slot, seen, offers, failed)
        if seen < 0:
            state.phases.add("step_begin", asked - began)
        state.phases.add("step_rendezvous", time.perf_counter() - asked)
        if answer.get("lost"):
            raise CollectiveLost(answer["lost"])
        seen, failed = answer["attempt"], None
        if answer.get("restart"):
            continue  # a worker left while this step waited: join the next attempt
        try:
            stored = _exchange(worker, state, name, slot, spec, layout, inputs, answer)
        except StepAborted:
            continue  # the scheduler restarts the exchange: join its next attempt
        except TransportError as e:
            failed = str(e)  # the scheduler restarts it if a worker left, else loses it
            continue
        return {"slot": slot, "worker": worker.address, "attempt": seen, "outputs": stored}


def take(name: str, flat: int, owner: int, *results):
    """Output chunk ``flat`` (its flat index) of the exchange ``name``, joined by slot
    ``owner`` (``results``: every step's, in slot order)."""
    key = (name, "out", flat)
    worker = _worker()
    if worker is None:
        with LOCAL_LOCK:
            found = LOCAL_OUTPUTS.pop(key, None)
        if found is None:
            raise CollectiveLost(f"exchange {name[-12:]}: output chunk {flat} is gone (taken already)")
        return found
    data = worker.data
    if key in data:
        value = data[key]
        del data[key]
        return value
    holder = results[owner]["worker"]
    if holder == worker.address:
        raise CollectiveLost(f"exchange {name[-12:]}: output chunk {flat} is gone from worker {holder} "
                             f"(taken already, or the exchange was dropped)")
    return on_loop(worker, _take_from, worker, holder, key)


# --- one attempt


def _exchange(worker, state: StepState, name: str, slot: int, spec: tuple, layout, inputs: dict,
              answer: dict) -> int:
    """One attempt of the step: every round; returns how many outputs it stored."""
    if answer["kind"] in PUT_KINDS:
        return _exchange_put(worker, state, name, slot, spec, layout, inputs, answer)
    old, new, slots, rounds, dtype, module = spec
    attempt, kind, peers = answer["attempt"], answer["kind"], {int(s): a for s, a in answer["peers"].items()}
    transport = state.transport(kind, host=_host(worker), gpu=module == "cupy")
    xid = exchange_id(attempt)
    xp = _xp(module)
    itemsize = xp.dtype(dtype).itemsize
    plan = plan_of(old, new)
    grid = tuple(map(len, plan.sizes))
    strides = tuple(b.strides for b in inputs.values())
    deadline = time.monotonic() + ROUND_DEADLINE_S
    stored = 0
    for r in range(rounds):
        began = time.perf_counter()
        outs = {j: xp.empty(plan.output_shape(j), dtype=dtype) for j in layout.outputs_of.get((slot, r), ())}
        # receives first: each message into its output where it lands there as it is, into
        # a buffer to join from otherwise
        incoming = layout.received(slot, r)
        pending, joining, received = [], {}, 0
        for s, send in incoming.items():
            for m, message in enumerate(send.messages):
                if message.output is not None:
                    target = outs[message.output].reshape(-1)[message.at:message.at + message.elements]
                else:
                    target = joining[s] = xp.empty(message.elements, dtype=dtype)
                pending.append(transport.recv(peers[s], tag_of(xid, r, s, slot, m), target))
                received += message.elements * itemsize
        # every peer's pieces cut and sent first; this slot's own pieces cut into its outputs
        # while they move
        posted_at = time.perf_counter()
        cut = Batch(itemsize, key=("step-cut", old, new, slots, rounds, slot, r, strides, itemsize))
        sent = {}
        for d in range(slots):
            send = layout.sends.get((slot, d, r))
            if send is None or d == slot:
                continue
            buffer = sent[d] = xp.empty(send.elements, dtype=dtype)
            for (i, j), (offset, shape, src) in send.pieces.items():
                cut.add(inputs[i], src, buffer, Flat(offset, shape))
        cut.run()
        _synchronize(module)  # the transport reads the buffers from its own streams
        cut_at = time.perf_counter()
        for d, buffer in sent.items():
            for m, message in enumerate(layout.sends[(slot, d, r)].messages):
                part = buffer[message.offset:message.offset + message.elements]
                pending.append(transport.send(peers[d], tag_of(xid, r, slot, d, m), part))
        own = layout.sends.get((slot, slot, r))
        if own is not None:
            local = Batch(itemsize, key=("step-own", old, new, slots, rounds, slot, r, strides, itemsize))
            for (i, j), (_, _, src) in own.pieces.items():
                local.add(inputs[i], src, outs[j], layout.places[(i, j)])
            local.run()
        own_at = time.perf_counter()
        try:
            wait(pending, aborted=lambda: state.ended(name, attempt), deadline=deadline,
                 what=f"exchange {name[-12:]} round {r} on {worker.address}")
        except BaseException:
            transport.forget(xid, pending)
            raise
        moved_at = time.perf_counter()
        _log_moves(worker, answer["workers"], incoming, itemsize, time.time() - (moved_at - cut_at))
        if joining:
            join = Batch(itemsize, key=("step-join", old, new, slots, rounds, slot, r, itemsize))
            for s, buffer in joining.items():
                for (i, j), offset in incoming[s].joined.items():
                    shape = incoming[s].pieces[(i, j)][1]
                    join.add(buffer, Flat(offset, shape), outs[j], layout.places[(i, j)])
            join.run()
        _synchronize(module)  # the store may copy the outputs to host on its own streams
        stored += _round_ends(worker, state, kind, name, grid, outs, received,
                              (("step_post", began), ("step_cut", posted_at), ("step_own", cut_at),
                               ("step_move", own_at), ("step_join", moved_at), ("step_store", time.perf_counter())))
        deadline = time.monotonic() + ROUND_DEADLINE_S
    return stored


def _exchange_put(worker, state: StepState, name: str, slot: int, spec: tuple, layout, inputs: dict,
                  answer: dict) -> int:
    """One attempt of the step over CUDA IPC (:mod:`.ipc`): a round allocates its outputs,
    publishes where they lie, and once every step has, one kernel writes each piece of its
    inputs into the output it lands in, this worker's or a peer's; the outputs are whole
    once every step says its kernel ended."""
    import cupy

    from .ipc import Exported

    old, new, slots, rounds, dtype, module = spec
    attempt, kind = answer["attempt"], answer["kind"]
    ipc = state.transport(kind, host=_host(worker), gpu=True)
    itemsize = cupy.dtype(dtype).itemsize
    plan = plan_of(old, new)
    grid = tuple(map(len, plan.sizes))
    strides = tuple(b.strides for b in inputs.values())
    stored = 0
    for r in range(rounds):
        began = time.perf_counter()
        outs = {j: cupy.empty(plan.output_shape(j), dtype=dtype) for j in layout.outputs_of.get((slot, r), ())}
        places = {}
        for j, out in outs.items():
            place = ipc.export(out)
            places[flat_index(j, grid)] = (place.handle, place.offset)
        # the pool hands out memory in this stream's order: what a kernel still queued here
        # reads may lie where a peer is about to write
        _synchronize(module)
        posted_at = time.perf_counter()
        met = _met(on_loop(worker, _meet, worker, name, slot, attempt, "places", r, places))
        met_at = time.perf_counter()
        failed = None
        received = 0
        try:
            peers = {int(s): p for s, p in met["payloads"].items()}
            batch = Batch(itemsize, key=("step-put", old, new, slots, rounds, slot, r, strides, itemsize))
            theirs: dict = {}
            for d in range(slots):
                send = layout.sends.get((slot, d, r))
                if send is None:
                    continue
                for (i, j), (_, _, src) in send.pieces.items():
                    if d == slot:
                        target = outs[j]
                    else:
                        target = theirs.get((d, j))
                        if target is None:
                            handle, offset = peers[d][flat_index(j, grid)]
                            target = theirs[(d, j)] = ipc.open(Exported(handle, offset), plan.output_shape(j), dtype)
                    batch.add(inputs[i], src, target, layout.places[(i, j)])
            batch.run()
            _synchronize(module)  # written, every byte, before the peers are told
            received = sum(send.elements for send in layout.received(slot, r).values()) * itemsize
        except Exception as e:  # noqa: BLE001 (said at the meeting: every step ends, none waits)
            failed = f"{type(e).__name__}: {e}"
        cut_at = time.perf_counter()
        done = on_loop(worker, _meet, worker, name, slot, attempt, "done", r, {"failed": failed})
        if failed:
            raise TransportError(f"exchange {name[-12:]} round {r} on {worker.address}: {failed}")
        _met(done)
        stored += _round_ends(worker, state, kind, name, grid, outs, received,
                              (("step_post", began), ("step_places", posted_at), ("step_cut", met_at),
                               ("step_done", cut_at), ("step_store", time.perf_counter())))
    return stored


def _round_ends(worker, state: StepState, kind: str, name: str, grid: tuple, outs: dict, received: int,
                marks: tuple) -> int:
    """A round's outputs kept in the worker's store, the round counted for ``kind``, and
    its phases: ``marks`` is each phase's name and when it began, in order, the last one
    ending when its outputs are kept. Returns how many outputs it kept."""
    keep(worker, {(name, "out", flat_index(j, grid)): out for j, out in outs.items()})
    ended = time.perf_counter()
    state.moved_over[kind] = state.moved_over.get(kind, 0) + 1
    for (phase, began), (_, until) in zip(marks, (*marks[1:], (None, ended))):
        state.phases.add(phase, until - began)
    state.phases.taken_bytes += received
    return len(outs)


def _met(answer: dict) -> dict:
    """A meeting's answer, or the attempt's end as the step takes it."""
    if answer.get("lost"):
        raise CollectiveLost(answer["lost"])
    if answer.get("restart"):
        raise StepAborted("the exchange restarts: a worker left")
    return answer


def _log_moves(worker, workers: dict, received: dict, itemsize: int, start: float) -> None:
    """What a round received (``received``: sender -> :class:`~.layout.Send`), in the
    worker's incoming transfer log as gathers' entries (the bench and the dashboard read
    bytes moved there): one a peer, over the round's move."""
    stop = time.time()
    for s, send in received.items():
        log_incoming(worker, workers.get(s, workers.get(str(s), "")), {("step", s): send.elements * itemsize},
                     start, stop)


def exchange_id(attempt: int) -> int:
    """The bits of a tag that name an exchange's attempt (:func:`~.transport.tag_of`): the
    scheduler numbers attempts in sequence, so that exchanges at once never share them."""
    return attempt & ((1 << EXCHANGE_BITS) - 1)


def _local(name: str, old: tuple, new: tuple, layout, inputs: dict, dtype, module: str) -> dict:
    """A step run without a distributed worker (dask's local schedulers, or a graph built
    for a cluster computed in one process): its inputs' pieces written straight into the
    outputs, which every step of the exchange shares in this process (each getter runs
    after every step)."""
    xp = _xp(module)
    plan = plan_of(old, new)
    grid = tuple(map(len, plan.sizes))
    itemsize = xp.dtype(dtype).itemsize
    batch = Batch(itemsize)
    for send in layout.sends.values():
        for (i, j), (_, _, src) in send.pieces.items():
            if i not in inputs:
                continue
            key = (name, "out", flat_index(j, grid))
            with LOCAL_LOCK:
                out = LOCAL_OUTPUTS.get(key)
                if out is None:
                    out = LOCAL_OUTPUTS[key] = xp.empty(plan.output_shape(j), dtype=dtype)
            batch.add(inputs[i], src, out, layout.places[(i, j)])
    batch.run()
    return {"slot": None, "worker": None, "attempt": 0, "outputs": 0}


# --- the worker's side


def _worker():
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _xp(module: str):
    if module == "cupy":
        import cupy

        return cupy
    import numpy

    return numpy


def _synchronize(module: str) -> None:
    if module == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def _host(worker) -> str:
    from distributed.comm import get_address_host

    return get_address_host(worker.address)


def _offers(worker, state: StepState, module: str) -> dict:
    """Kind -> this worker's address on it, for every kind it offers (each started)."""
    from spillway.options.settings import worker_value

    kinds = offered(worker_value("exchange_transport"), gpu=module == "cupy")
    out = {}
    for kind in kinds:
        try:
            out[kind] = state.transport(kind, host=_host(worker), gpu=module == "cupy").address()
        except Exception as e:  # noqa: BLE001 (a kind that does not start here is not offered)
            logger.warning("the %s exchange transport does not start on %s: %s: %s", kind, worker.address,
                           type(e).__name__, e)
    return out


async def _join(worker, name: str, slot: int, seen: int, offers: dict, failed: str | None) -> dict:
    return await worker.scheduler.spillway_step_join(name=name, slot=slot, seen=seen, worker=worker.address,
                                                     offers=offers, failed=failed)


async def _meet(worker, name: str, slot: int, attempt: int, stage: str, round_: int, payload) -> dict:
    return await worker.scheduler.spillway_step_meet(name=name, slot=slot, attempt=attempt, stage=stage,
                                                     round=round_, payload=payload)


async def _take_from(worker, holder: str, key):
    try:
        response = await worker.rpc(holder).spillway_step_give(key=list(key))
    except OSError as e:
        raise CollectiveLost(f"exchange {key[0][-12:]}: output chunk {key[2]} is on worker {holder}, "
                             f"which is gone ({type(e).__name__})") from None
    if response is None:
        raise CollectiveLost(f"exchange {key[0][-12:]}: output chunk {key[2]} is gone from worker {holder}")
    from distributed.protocol.serialize import Serialize

    # an in-process comm hands the wrapper over as it is
    return response.data if isinstance(response, Serialize) else response


def _state(worker) -> StepState:
    """The worker's step state, its plugin and handlers added by the first step here
    (:mod:`spillway.datapath.on_worker`)."""
    return plugin_of(worker, WORKER_PLUGIN, _plugin).state


def _plugin(worker):
    from .plugin import StepWorker
    from .state import ABORT, DROP

    plugin = StepWorker()
    return (plugin, {GIVE: _give_handler(worker)},
            {ABORT: _abort_handler(plugin.state), DROP: _drop_handler(worker, plugin.state)})


def _give_handler(worker):
    async def give(key=None):
        from distributed.protocol import to_serialize

        key = tuple(key)
        if key not in worker.data:
            return None
        value = worker.data[key]
        del worker.data[key]
        return to_serialize(value)

    return give


def _abort_handler(state: StepState):
    def abort(name=None, attempt=0, why="", **_):
        state.end(name, attempt, why)

    return abort


def _drop_handler(worker, state: StepState):
    def drop(name=None, **_):
        left = [k for k in list(worker.data) if type(k) is tuple and len(k) == 3 and k[0] == name and k[1] == "out"]
        for key in left:
            if key in worker.data:
                del worker.data[key]
        state.forget(name)
        if left:
            logger.info("dropped %d output(s) an exchange left on %s", len(left), worker.address)

    return drop
