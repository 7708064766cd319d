"""Where an exchange's output chunks are assembled, and how a cut packs what it sends
each of them: pure arithmetic on the plan, the same on every worker.

The scheduler fixes an exchange's *layout* once, at its first cut: the running workers in
order, whether it is *grouped*, and in how many *batches* each worker assembles its
outputs. The rechunk's ``n`` output chunks fall in ``G = workers x batches`` contiguous
*groups*: output chunk ``j`` (its flat index) is in group ``j * G // n``, which worker
``group // batches`` assembles. Grouped, each cut packs the pieces of every group into one
buffer for that group (pieces in plan order, each contiguous): the owner of a group then
takes its buffers in one request per holder, instead of one value per piece.

One batch a worker is an exchange that fits the workers' fastest tier a few times over:
the first assembly on a worker takes all its buffers at once. An exchange past that is
cut into more batches, each of a size the device holds beside its work: the buffers of a
batch are spilled, restored and moved together, and a worker assembles its batches one
after another, so that what it restores is assembled soon and then dropped. Ungrouped
(no scheduler plugin, or a group fraction of 0), each piece is a value of its own.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .plan import Plan


@dataclass(frozen=True)
class Layout:
    workers: tuple[str, ...]
    grouped: bool
    #: groups of outputs a worker assembles one after another (1: all at once)
    batches: int = 1

    @property
    def groups(self) -> int:
        return len(self.workers) * self.batches

    def group(self, index: tuple, grid: tuple) -> int:
        """The group of output chunk ``index`` of an output grid of ``grid`` chunks."""
        return owner(index, grid, self.groups)

    def owner(self, index: tuple, grid: tuple) -> int:
        """The worker (its index in ``workers``) that assembles output chunk ``index``."""
        return self.group(index, grid) // self.batches

    def as_list(self) -> list:
        """The layout as it travels in messages and task results."""
        return [list(self.workers), self.grouped, self.batches]

    @classmethod
    def from_list(cls, found) -> "Layout":
        return cls(tuple(found[0]), bool(found[1]), int(found[2]) if len(found) > 2 else 1)


def flat_index(index: tuple, grid: tuple) -> int:
    """The C-order position of chunk ``index`` in a grid of ``grid`` chunks."""
    flat = 0
    for i, g in zip(index, grid):
        flat = flat * g + i
    return flat


def owner(index: tuple, grid: tuple, parts: int) -> int:
    """Which of ``parts`` contiguous runs of a grid's chunks (workers, or groups) chunk
    ``index`` falls in."""
    return flat_index(index, grid) * parts // math.prod(grid)


def batches_for(nbytes: float, workers: int, room: float) -> int:
    """Batches a worker assembles an exchange of ``nbytes`` in, so that one batch's
    buffers take at most ``room`` bytes on a worker."""
    if workers <= 0 or room <= 0 or room == math.inf:
        return 1
    return max(1, math.ceil(nbytes / workers / room))


@functools.lru_cache(maxsize=64)
def plan_of(old: tuple, new: tuple) -> Plan:
    """The plan of a rechunk, made once a process (every task of an exchange asks)."""
    return Plan(old, new)


@functools.lru_cache(maxsize=4096)
def packing(old: tuple, new: tuple, index: tuple, groups: int) -> dict:
    """How input chunk ``index`` packs its pieces: group -> ``(elements, {output index:
    (offset, shape, slices in the input chunk)})`` (one batch a worker: the groups are
    the workers)."""
    plan = plan_of(old, new)
    grid = tuple(map(len, new))
    out: dict = {}
    for j, src in plan.pieces_of(index):
        d = owner(j, grid, groups)
        total, pieces = out.setdefault(d, [0, {}])
        shape = tuple(s.stop - s.start for s in src)
        pieces[j] = (total, shape, src)
        out[d][0] = total + math.prod(shape)
    return {d: (total, pieces) for d, (total, pieces) in out.items()}


@functools.lru_cache(maxsize=4096)
def owned_parts(old: tuple, new: tuple, index: tuple, groups: int, g: int) -> tuple:
    """Where group ``g``'s owner finds each piece of output chunk ``index`` in the buffers
    packed for the group: ``(input index, its flat index, offset, shape)`` in the plan's
    order (every assembly of the chunk asks, from the first run of the rechunk on)."""
    plan = plan_of(old, new)
    in_grid = tuple(map(len, old))
    return tuple((i, flat_index(i, in_grid), *packing(old, new, i, groups)[g][1][index][:2])
                 for i, _ in plan.parts_of(index))


@functools.lru_cache(maxsize=4096)
def group_size(old: tuple, new: tuple, partial: int, groups: int, g: int) -> int:
    """Output chunks of one partial of the rechunk that fall in group ``g``."""
    grid = tuple(map(len, new))
    return sum(1 for j in plan_of(old, new).partials[partial].outputs if owner(j, grid, groups) == g)
