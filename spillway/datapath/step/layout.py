"""Who cuts, sends and joins what in an exchange made as one step a worker: pure
arithmetic on the plan, the same on every worker, so that no size or offset is ever sent.

An exchange has ``slots`` steps (one a worker when the graph was built). Each exchanging
input chunk belongs to one slot, whose step cuts it: contiguous runs in C order, or as the
graph gives them (the workers already holding a persisted array's chunks). Each output
chunk is joined by the slot whose inputs hold most of its elements, the contiguous run's
slot where several hold as many (a panel rechunk, where every input gives every output the
same share: contiguous runs; a halo, where each output is mostly its own input: the
input's slot). Each slot joins its outputs in ``rounds`` contiguous groups; in round
``r`` every slot sends every other one buffer: the pieces of its inputs that the other's
round-``r`` outputs need, in input order then in the plan's order of each input's pieces.
The receiver reads each piece at the offset this module gives both ends.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from spillway.datapath.collective.layout import plan_of


@dataclass(frozen=True)
class Message:
    """One transfer of a :class:`Send`: ``elements`` from ``offset`` of the sender's buffer.
    ``output``: the output chunk it lands in as it is, at element ``at`` of the chunk's C
    order (its pieces make one C-contiguous run there, as a panel rechunk's and an FFT
    axis swap's do); None: it lands in a receive buffer, and its pieces are joined from
    there."""

    offset: int
    elements: int
    output: tuple | None = None
    at: int = 0


@dataclass(frozen=True)
class Send:
    """What slot ``s`` sends slot ``d`` in one round: ``elements`` in all; each piece
    ``(input index, output index) -> (offset in the sender's buffer, shape, slices in the
    input chunk)``; the :class:`Message` s it goes in (those straight into outputs first,
    then at most one to join from); and where each piece to join lies in that last one
    (``(input, output) -> offset``)."""

    elements: int
    pieces: dict
    messages: tuple = ()
    joined: dict = None


@dataclass(frozen=True)
class StepLayout:
    slots: int
    rounds: int
    #: input index -> its slot; output index -> its slot and its round (exchanging chunks only)
    in_slot: dict
    out_slot: dict
    out_round: dict
    #: slot -> its input indices in order; (slot, round) -> its output indices in order
    inputs_of: dict
    outputs_of: dict
    #: (sender, receiver, round) -> :class:`Send`, for every pair that moves something
    sends: dict
    #: (input index, output index) -> where the piece goes in its output chunk (slices)
    places: dict

    def received(self, d: int, r: int) -> dict:
        """Sender -> :class:`Send` of what slot ``d`` receives in round ``r`` (itself left out)."""
        return {s: send for (s, dd, rr), send in self.sends.items() if dd == d and rr == r and s != d}

    def moved_elements(self, s: int) -> int:
        """Elements slot ``s`` sends to other slots over all rounds."""
        return sum(send.elements for (ss, d, _), send in self.sends.items() if ss == s and d != s)


def exchanging(old: tuple, new: tuple) -> tuple[tuple, tuple]:
    """The input and output chunk indices of the plan's exchanging partials, in C order."""
    plan = plan_of(old, new)
    inputs = sorted(i for p in plan.partials if p.exchanges for i in p.inputs)
    outputs = sorted(j for p in plan.partials if p.exchanges for j in p.outputs)
    return tuple(inputs), tuple(outputs)


def contiguous_slots(n: int, slots: int) -> tuple[int, ...]:
    """Slot of each of ``n`` chunks: contiguous runs, as even as whole chunks allow."""
    return tuple(k * slots // n for k in range(n))


@functools.lru_cache(maxsize=64)
def step_layout(old: tuple, new: tuple, slots: int, rounds: int, in_slots: tuple | None = None) -> StepLayout:
    """The layout of the exchange of ``plan_of(old, new)`` over ``slots`` steps in
    ``rounds`` rounds; ``in_slots``: each exchanging input's slot in C order (contiguous
    runs where None)."""
    if slots < 1 or rounds < 1:
        raise ValueError(f"an exchange takes at least one slot and one round, not {slots} and {rounds}")
    plan = plan_of(old, new)
    inputs, outputs = exchanging(old, new)
    if in_slots is None:
        in_slots = contiguous_slots(len(inputs), slots)
    if len(in_slots) != len(inputs) or any(not 0 <= s < slots for s in in_slots):
        raise ValueError(f"{len(in_slots)} input slots for {len(inputs)} inputs over {slots} slots")
    in_slot = dict(zip(inputs, in_slots))
    even = contiguous_slots(len(outputs), slots)
    out_slot = {}
    for j, fallback in zip(outputs, even):
        share = [0] * slots
        for i, dst in plan.parts_of(j):
            share[in_slot[i]] += math.prod(s.stop - s.start for s in dst)
        most = max(share)
        out_slot[j] = fallback if share[fallback] == most else share.index(most)
    outputs_of: dict = {}
    out_round = {}
    for d in range(slots):
        mine = [j for j in outputs if out_slot[j] == d]
        for k, j in enumerate(mine):
            r = k * rounds // len(mine)
            out_round[j] = r
            outputs_of.setdefault((d, r), []).append(j)
    inputs_of: dict = {}
    for i in inputs:
        inputs_of.setdefault(in_slot[i], []).append(i)
    building: dict = {}
    for s in range(slots):
        for i in inputs_of.get(s, ()):
            for j, src in plan.pieces_of(i):
                if j in out_slot:
                    building.setdefault((s, out_slot[j], out_round[j]), []).append((i, j, src))
    sends = {key: _send(plan, found, direct=key[0] != key[1]) for key, found in building.items()}
    places = {(i, j): dst for j in outputs for i, dst in plan.parts_of(j)}
    return StepLayout(slots=slots, rounds=rounds, in_slot=in_slot, out_slot=out_slot, out_round=out_round,
                      inputs_of={s: tuple(v) for s, v in inputs_of.items()},
                      outputs_of={k: tuple(v) for k, v in outputs_of.items()}, sends=sends, places=places)


#: messages of one send that land straight in outputs, at most (the tag's room; the rest
#: are joined from the last message)
MAX_DIRECT = (1 << 12) - 1


def _send(plan, found: list, direct: bool) -> Send:
    """The :class:`Send` of ``found`` (``(input, output, slices in the input)`` in input
    order): the pieces of each output that make one C-contiguous run of it go first, as a
    message into that output (``direct``: to another slot), the others after them."""
    by_output: dict = {}
    for i, j, src in found:
        by_output.setdefault(j, []).append((i, src))
    straight, rest = [], []
    for j, parts in by_output.items():
        run = _run_of(plan, j, parts) if direct and len(straight) < MAX_DIRECT else None
        if run is None:
            rest += [(i, j, src) for i, src in parts]
        else:
            straight.append((j, *run))
    pieces, messages, joined, total = {}, [], {}, 0
    for j, at, ordered in straight:
        start = total
        for i, src in ordered:
            shape = tuple(x.stop - x.start for x in src)
            pieces[(i, j)] = (total, shape, src)
            total += math.prod(shape)
        messages.append(Message(start, total - start, j, at))
    rest_start = total
    for i, j, src in sorted(rest, key=lambda p: (p[0], p[1])):
        shape = tuple(x.stop - x.start for x in src)
        pieces[(i, j)] = (total, shape, src)
        joined[(i, j)] = total - rest_start
        total += math.prod(shape)
    if total > rest_start:
        messages.append(Message(rest_start, total - rest_start))
    return Send(total, pieces, tuple(messages), joined)


def _run_of(plan, j: tuple, parts: list) -> tuple | None:
    """``(first element, parts in order)`` where the pieces ``parts`` (``(input, slices)``)
    of output ``j`` make one C-contiguous run of it; None otherwise."""
    shape = plan.output_shape(j)
    dst_of = dict(plan.parts_of(j))
    ranges = []
    for i, src in parts:
        found = flat_range(dst_of[i], shape)
        if found is None:
            return None
        ranges.append((found, i, src))
    ranges.sort(key=lambda r: r[0][0])
    for (a, _, _), (b, _, _) in zip(ranges, ranges[1:]):
        if a[1] != b[0]:
            return None
    return ranges[0][0][0], [(i, src) for _, i, src in ranges]


def flat_range(dst: tuple, shape: tuple) -> tuple[int, int] | None:
    """The elements ``[start, stop)`` of an array of ``shape`` (C order) that the box
    ``dst`` (slices) covers, where they are one run; None where they are not."""
    extents = [x.stop - x.start for x in dst]
    first = next((d for d, e in enumerate(extents) if e != 1), len(extents))
    if any(extents[d] != shape[d] for d in range(first + 1, len(shape))):
        return None
    start, stride = 0, 1
    for d in reversed(range(len(shape))):
        start += dst[d].start * stride
        stride *= shape[d]
    return start, start + math.prod(extents)


def rounds_for(old: tuple, new: tuple, slots: int, itemsize: int, round_bytes: int) -> int:
    """Rounds enough that what a slot receives in one round stays within ``round_bytes``
    (at most one round an output chunk of the busiest slot, and the tags' room)."""
    from .transport import MAX_ROUNDS

    if round_bytes <= 0:
        return 1
    layout = step_layout(old, new, slots, 1)
    received = max((sum(s.elements for s in layout.received(d, 0).values()) for d in range(slots)), default=0)
    most_outputs = max((len(v) for v in layout.outputs_of.values()), default=1)
    return max(1, min(most_outputs, MAX_ROUNDS, math.ceil(received * itemsize / round_bytes)))

