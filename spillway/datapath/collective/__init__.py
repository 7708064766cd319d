"""Rechunks, and map_overlap's halos, as one collective: each worker cuts its input
chunks into the pieces each output chunk needs, keeps them in its store, and the output
chunks' assemblies take their pieces from every worker in bulk (over the data plane
between GPUs, device to device). A few tasks a chunk, not one a piece.

- :mod:`.plan`: which piece of which input goes where, from the chunk grids alone;
- :mod:`.layout`: where the outputs are assembled and how a cut packs for each worker;
- :mod:`.names`: the names of the collective's keys;
- :mod:`.graph`: the dask array (cut, barrier, assemble) of a rechunk or of an overlap's
  grown chunks;
- :mod:`.way`: whether a rechunk takes the collective or dask's task method (it would not
  fit the workers' fastest tier);
- :mod:`.exchange`: those tasks as they run on the workers;
- :mod:`.state` and :mod:`.plugin`: what they keep between them on a worker, one run an
  exchange, in a worker plugin;
- :mod:`.spread`: the scheduler plugin that spreads the assemblies and drops leftovers;
- :mod:`.method`: users' ``x.rechunk(...)`` and ``map_overlap`` routed here on spillway's clusters.
"""

from .exchange import CollectiveLost
from .graph import rechunk
from .plan import ExchangePlan

__all__ = ["PLUGIN_NAME", "CollectiveLost", "CollectivePlacement", "ExchangePlan", "rechunk", "use_on"]


def __getattr__(name):
    # the scheduler's plugin and the routing of dask's rechunks load distributed: the
    # workflows build their graphs (and a refusal is said) without it
    if name in ("PLUGIN_NAME", "CollectivePlacement"):
        from . import spread

        return getattr(spread, name)
    if name == "use_on":
        from .method import use_on

        return use_on
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
