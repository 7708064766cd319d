"""An exchange as one step a worker, as dask layers: ``slots`` step tasks, each reading
its slot's input chunks (:mod:`.layout`), and one getter an output chunk, reading every
step's small result (so that an output lost with its worker makes dask run every step
again: each step's peers need it to make theirs). A rechunk of ``n`` input and ``m``
output chunks is ``slots + m`` tasks, where the pieces' way was ``n + m`` and a barrier
a partial, and dask's task method a task a piece.
"""

from __future__ import annotations

import math

from spillway.datapath.collective.layout import flat_index
from spillway.upstream import task_ref, unfused_task
from .layout import step_layout
from .names import STEP_PREFIX
from .task import step, take


def step_layers(x, new: tuple, plan, token: str, out_name: str, slots: int, rounds: int) -> tuple[dict, dict]:
    """The step and getter tasks of ``plan`` (``x.chunks`` to ``new``, chunk sizes or
    windows): ``(steps, getters)``, each a dict of tasks."""
    import numpy as np
    from dask.array.utils import meta_from_array

    module = "cupy" if type(meta_from_array(x)).__module__.startswith("cupy") else "numpy"
    old = x.chunks
    layout = step_layout(old, new, slots, rounds)
    name = STEP_PREFIX + token
    spec = (old, new, slots, rounds, np.dtype(x.dtype).str, module)
    steps = {}
    for s in range(slots):
        key = (name, s)
        steps[key] = unfused_task(key, step, name, s, spec,
                                  *[task_ref((x.name, *i)) for i in layout.inputs_of.get(s, ())])
    refs = [task_ref((name, s)) for s in range(slots)]
    grid = tuple(map(len, plan.sizes))
    getters = {}
    for j, owner in layout.out_slot.items():
        key = (out_name, *j)
        getters[key] = unfused_task(key, take, name, flat_index(j, grid), owner, *refs)
    return steps, getters


def held_by_steps(x, new: tuple, plan, slots: int) -> dict:
    """The step layer's ``collection_annotations``: each step as a chunk of its slot's
    input elements, so that the capacity check counts what a step holds (its outputs, as
    many bytes as its inputs) as a cut's pieces were counted (:mod:`spillway.memory.graph_bytes`)."""
    layout = step_layout(x.chunks, new, slots, 1)
    per_slot = tuple(sum(math.prod(plan.input_shape(i)) for i in layout.inputs_of.get(s, ())) for s in range(slots))
    return {"type": type(x), "chunks": (per_slot,), "dtype": x.dtype}
