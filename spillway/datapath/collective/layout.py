"""Where an exchange's output chunks are assembled, and how a cut packs what it sends
each of them: pure arithmetic on the plan, the same on every worker.

The scheduler fixes an exchange's *layout* once, at its first cut: the running workers in
order, and whether it is *grouped*. Output chunk ``j`` (its flat index among the
rechunk's ``n`` output chunks) is assembled on worker ``j * W // n`` (contiguous runs). Grouped, each cut
packs the pieces every worker will assemble into one buffer for that worker (pieces in
plan order, each contiguous): the workers then move one buffer per (input, worker),
all of it in one request per holder, instead of one value per piece. Where the exchange
would not fit the workers' fastest tier, it is not grouped: each piece is a value of its
own, so that the tiered store spills and restores exactly the pieces an assembly needs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .plan import ExchangePlan


@dataclass(frozen=True)
class PieceLayout:
    workers: tuple[str, ...]
    grouped: bool

    def owner(self, index: tuple, grid: tuple) -> int:
        """The worker (its index in ``workers``) that assembles output chunk ``index`` of
        an output grid of ``grid`` chunks."""
        return owner(index, grid, len(self.workers))


def flat_index(index: tuple, grid: tuple) -> int:
    """The C-order position of chunk ``index`` in a grid of ``grid`` chunks."""
    flat = 0
    for i, g in zip(index, grid):
        flat = flat * g + i
    return flat


def owner(index: tuple, grid: tuple, workers: int) -> int:
    return flat_index(index, grid) * workers // math.prod(grid)


@functools.lru_cache(maxsize=64)
def plan_of(old: tuple, new: tuple) -> ExchangePlan:
    """The plan of a rechunk, made once a process (every task of an exchange asks)."""
    return ExchangePlan(old, new)


@functools.lru_cache(maxsize=4096)
def packing(old: tuple, new: tuple, index: tuple, workers: int) -> dict:
    """How input chunk ``index`` packs its pieces: worker -> ``(elements, {output index:
    (offset, shape, slices in the input chunk)})``."""
    plan = plan_of(old, new)
    grid = tuple(map(len, new))
    out: dict = {}
    for j, src in plan.pieces_of(index):
        d = owner(j, grid, workers)
        total, pieces = out.setdefault(d, [0, {}])
        shape = tuple(s.stop - s.start for s in src)
        pieces[j] = (total, shape, src)
        out[d][0] = total + math.prod(shape)
    return {d: (total, pieces) for d, (total, pieces) in out.items()}


@functools.lru_cache(maxsize=4096)
def owned_parts(old: tuple, new: tuple, index: tuple, workers: int, d: int) -> tuple:
    """Where worker ``d`` finds each piece of output chunk ``index`` in the buffers packed
    for it: ``(input index, its flat index, offset, shape)`` in the plan's order (every
    assembly of the chunk asks, from the first run of the rechunk on)."""
    plan = plan_of(old, new)
    in_grid = tuple(map(len, old))
    return tuple((i, flat_index(i, in_grid), *packing(old, new, i, workers)[d][1][index][:2])
                 for i, _ in plan.parts_of(index))
