"""The GPU stack installed here, by import name: what ``spillway info`` and the bench's
machine description report (the bench imports it from here, the product's CLI too)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

#: import name -> distribution names that may provide it (first installed wins)
STACK = {
    "dask": ("dask",),
    "distributed": ("distributed",),
    "dask_cuda": ("dask-cuda",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    "rmm": ("rmm-cu13", "rmm-cu12", "rmm"),
    "distributed_ucxx": ("distributed-ucxx-cu13", "distributed-ucxx-cu12", "distributed-ucxx"),
    "ucxx": ("ucxx-cu13", "ucxx-cu12", "ucxx"),
    "zarr": ("zarr",),
    "kvikio": ("kvikio-cu13", "kvikio-cu12", "kvikio"),
    "pynvml": ("nvidia-ml-py",),
}


def installed_stack() -> dict[str, str | None]:
    out = {}
    for module, dists in STACK.items():
        version = None
        if importlib.util.find_spec(module) is not None:
            for dist in dists:
                try:
                    version = importlib.metadata.version(dist)
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
            version = version or "installed"
        out[module] = version
    return out
