"""The bytes of a graph's keys from the expression a client sends, and the most a graph
holds at once in dask's order (what the scheduler's capacity check compares)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
from dask.base import collections_to_expr
from dask.utils import key_split
from distributed.scheduler import _materialize_graph

from spillway.memory.graph_bytes import graph_bytes, peak_bytes


def _sized(collections, compute: bool = False):
    expr = collections_to_expr(collections, True)
    if compute:
        from dask._expr import FinalizeCompute

        expr = FinalizeCompute(expr)
    expr = expr.optimize()
    dsk, _ = _materialize_graph(expr, False)
    return expr, dsk, graph_bytes(expr, dsk)


def test_every_key_of_a_rechunk_has_its_bytes_its_pieces_from_their_slices():
    # row panels to column panels: dask plans stages, and the pieces between them
    n, p = 11600, 100
    x = da.ones((n, n), chunks=(p, n))
    y = x.rechunk((n, p), method="tasks")
    _, dsk, sizes = _sized([y])
    assert set(sizes) == set(dsk)
    assert all(sizes[(y.name, 0, j)] == n * p * 8 for j in range(n // p))
    pieces = {k: b for k, b in sizes.items() if key_split(k) == "rechunk-split"}
    assert len(pieces) > 100 and all(0 < b < n * n * 8 // 16 for b in pieces.values())
    assert sum(sizes[k] for k in dsk if type(k) is tuple and k[0] == x.name) == x.nbytes


def test_tasks_fused_into_one_take_the_bytes_of_the_last():
    x = da.ones((1000, 1000), chunks=(100, 1000))
    y = x.rechunk((1000, 100), method="tasks")  # small: each piece fused into its merge
    _, dsk, sizes = _sized([y])
    fused = [k for k in dsk if type(k) is tuple and k[0].startswith("rechunk-split-rechunk-merge-")]
    assert fused and all(sizes[k] == 1000 * 100 * 8 for k in fused)


def test_what_compute_hands_back_is_the_sum_of_what_it_gathers():
    x = da.ones((400, 300), chunks=(100, 300), dtype="float32")
    expr, dsk, sizes = _sized([x], compute=True)
    (out,) = [k for k in dsk if "finalize" in str(k) and k in set(dask.core.flatten(expr.__dask_keys__()))]
    assert sizes[out] == x.nbytes


def test_a_reduction_s_first_layer_is_not_counted_at_its_input_s_chunks():
    x = da.ones((1000, 1000), chunks=(100, 1000))
    _, dsk, sizes = _sized([x.sum(axis=1)])
    first = [k for k in dsk if type(k) is tuple and key_split(k[0]) == "sum" and "aggregate" not in k[0]]
    assert all(sizes.get(k, 0) < 100 * 1000 * 8 for k in first)
    assert sum(sizes.values()) < 2 * x.nbytes  # the input's chunks and little else


def test_unknown_chunks_and_objects_have_no_size():
    x = da.from_array(np.arange(100.0), chunks=10)
    _, _, sizes = _sized([x[x > 50]])
    assert all(n == 80 for k, n in sizes.items() if k[0] == x.name)
    assert not [k for k in sizes if "getitem" in str(k[0])]


def test_peak_counts_outputs_from_their_task_on_and_intermediates_until_their_last_use():
    # a -> b -> c (output); a and b are intermediates freed after their use
    deps = {"a": (), "b": ("a",), "c": ("b",)}
    sizes = {"a": 10, "b": 20, "c": 5}
    assert peak_bytes(["a", "b", "c"], deps.__getitem__, sizes, {"c"}) == 30  # a and b at once
    # two outputs built one after the other from one input held outside the graph
    deps = {"o1": ("held",), "o2": ("held",)}
    assert peak_bytes(["o1", "o2"], deps.__getitem__, {"o1": 7, "o2": 9, "held": 100}, {"o1", "o2"}) == 16
    # an alias kept keeps what it names, and adds nothing
    deps = {"t": (), "alias": ("t",)}
    assert peak_bytes(["t", "alias"], deps.__getitem__, {"t": 8, "alias": 8}, {"alias"}, {"alias": "t"}) == 8


def test_keys_sized_lately_are_looked_up_and_only_the_others_sized(monkeypatch):
    from spillway.memory import graph_bytes as module

    module._known.clear()
    sized, read = [], []
    real, real_layers = module.key_bytes, module.chunk_layers
    monkeypatch.setattr(module, "key_bytes",
                        lambda dsk, layers, keys=None, shapes=None: sized.append(list(dsk if keys is None else keys))
                        or real(dsk, layers, keys, shapes))
    monkeypatch.setattr(module, "chunk_layers", lambda expr: read.append(expr) or real_layers(expr))
    x = da.ones((400, 400), chunks=(100, 100))
    _, dsk, first = _sized([(x + x.T).sum()], compute=True)
    assert first and sized == [list(dsk)] and len(read) == 1
    # the same compute again (as a user runs it in a loop): compute's finalize is named
    # afresh each time, and only its keys are sized, from the shapes of what they gather,
    # without reading the expression
    expr, again_dsk, again = _sized([(x + x.T).sum()], compute=True)
    fresh = set(again_dsk) - set(dsk)
    assert fresh and set(sized[1]) == fresh and len(read) == 1
    # and the sizes are those worked out from nothing
    module._known.clear()
    assert again == module.graph_bytes(expr, again_dsk)
    assert sorted(again.values()) == sorted(first.values())


def test_the_keys_kept_are_bounded_those_not_asked_for_again_dropped(monkeypatch):
    from spillway.memory import graph_bytes as module

    module._known.clear()
    monkeypatch.setattr(module, "KNOWN_KEYS", 40)
    x = da.ones((400, 400), chunks=(100, 100))  # 16 keys a graph
    first, second, third = (set(_sized([x + i])[1]) for i in (1, 2, 3))  # a generation of 48 turns
    assert all(k in module._known for k in first | second | third)
    again = set(_sized([x + 1])[1])  # the first asked for again: looked up, kept
    assert again == first
    fourth, fifth = (set(_sized([x + i])[1]) for i in (4, 5))  # the next generation turns
    assert all(k in module._known for k in first | fourth | fifth)
    assert not any(k in module._known for k in second | third)  # not asked for again: dropped
    # a graph of more keys than a generation holds is sized, and keeps nothing
    module._known.clear()
    _, big, sizes = _sized([da.ones((700, 700), chunks=(100, 100)) + 1])
    assert len(big) > 40 and sizes and not any(k in module._known for k in big)
