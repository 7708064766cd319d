"""The step's layout, pure arithmetic on the plan: every piece sent once, to the slot that
joins its output; a panel rechunk's pieces land in their outputs as they are (no join);
halos' pieces are joined; rounds bound what a slot receives; and a graph built for a
cluster's slots computes on dask's local schedulers too."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spillway.datapath.collective.layout import plan_of
from spillway.datapath.collective.graph import overlap_windows
from spillway.datapath.step.layout import exchanging, flat_range, rounds_for, step_layout


def _elements(chunks) -> int:
    return math.prod(sum(axis) for axis in chunks)


@pytest.mark.parametrize("old, new, slots, rounds", [
    (((10,) * 6, (40,)), ((60,), (8,) * 5), 2, 1),
    (((3, 10, 24), (20, 33)), ((13, 24), (7, 7, 39)), 3, 2),
    (((5,) * 7, (4,) * 3, (6, 6)), ((7,) * 5, (12,), (3,) * 4), 4, 3),
])
def test_every_piece_goes_once_to_the_slot_that_joins_its_output(old, new, slots, rounds):
    layout = step_layout(old, new, slots, rounds)
    plan = plan_of(old, new)
    inputs, outputs = exchanging(old, new)
    sent = {}
    for (s, d, r), send in layout.sends.items():
        assert send.elements == sum(math.prod(shape) for _, shape, _ in send.pieces.values())
        # the messages tile the send's buffer, in order
        offset = 0
        for message in send.messages:
            assert message.offset == offset
            offset += message.elements
        assert offset == send.elements
        for (i, j) in send.pieces:
            assert layout.in_slot[i] == s and layout.out_slot[j] == d and layout.out_round[j] == r
            sent[(i, j)] = sent.get((i, j), 0) + 1
    expected = {(i, j) for i in inputs for j, _ in plan.pieces_of(i) if j in layout.out_slot}
    assert set(sent) == expected and set(sent.values()) == {1}
    assert sorted(j for v in layout.outputs_of.values() for j in v) == sorted(outputs)


def test_a_panel_rechunk_lands_in_its_outputs_and_halos_are_joined():
    panels = step_layout(((1000,) * 8, (8000,)), ((8000,), (1000,) * 8), 2, 1)
    for (s, d, _), send in panels.sends.items():
        if s != d:  # a message an output, straight into it
            assert all(m.output is not None for m in send.messages) and not send.joined
            assert len(send.messages) == 4
    old = ((16,) * 6, (16,) * 6)
    halos = step_layout(old, overlap_windows(old, {0: 1, 1: 1}), 4, 1)
    # a face across the rows is a run of its output; one down the columns is joined
    between = [send for (s, d, _), send in halos.sends.items() if s != d]
    assert between and any(send.joined for send in between)


def test_flat_range_is_a_run_of_c_order_or_none():
    assert flat_range((slice(2, 4), slice(0, 5)), (6, 5)) == (10, 20)
    assert flat_range((slice(3, 4), slice(1, 3)), (6, 5)) == (16, 18)
    assert flat_range((slice(2, 4), slice(1, 5)), (6, 5)) is None
    assert flat_range((slice(1, 2), slice(0, 3), slice(0, 7)), (4, 3, 7)) == (21, 42)


def test_rounds_bound_what_a_slot_receives():
    old, new = ((100,) * 10, (1000,)), ((1000,), (100,) * 10)
    one = rounds_for(old, new, 2, 8, 0)
    assert one == 1
    many = rounds_for(old, new, 2, 8, 100_000)
    layout = step_layout(old, new, 2, many)
    assert many > 1
    for d in range(2):
        for r in range(many):
            got = sum(s.elements for s in layout.received(d, r).values()) * 8
            # whole output chunks a round: within the bound, or one output chunk alone
            assert got <= 100_000 or len(layout.outputs_of[(d, r)]) == 1, (d, r, got)


def test_a_graph_built_for_three_slots_computes_on_dask_s_local_schedulers():
    import dask.array as da

    from spillway.datapath.collective import rechunk

    a = np.random.default_rng(0).standard_normal((100, 90))
    x = da.from_array(a, chunks=(10, 90))
    y = rechunk(x, (100, 9), room={"workers": 3, "steps": True, "fastest": 1e12, "held": 0})
    assert sum(1 for k in y.dask if type(k) is tuple and str(k[0]).startswith("spillway-step-")) == 3
    for scheduler in ("sync", "threads"):
        assert np.array_equal(y.compute(scheduler=scheduler), a)


def test_a_layout_refuses_what_it_cannot_make_in_one_line():
    with pytest.raises(ValueError, match="at least one slot and one round, not 0 and 1"):
        step_layout(((2, 2),), ((4,),), 0, 1)
    with pytest.raises(ValueError, match="3 input slots for 4 inputs over 2 slots"):
        step_layout(((2, 2), (2, 2)), ((4,), (1,) * 4), 2, 1, (0, 1, 1))
