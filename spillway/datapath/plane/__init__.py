"""The data plane: chunks moved between workers over persistent UCXX endpoints, under
distributed's own gathers.

Dask keeps placement, the task graph and every transfer decision (which keys, from which
peer, when, retries); only the bytes of a gather change path. A worker plugin
(:mod:`.plugin`) gives each worker a listener on the UCXX context its comm already runs
and routes distributed's worker-to-worker gather (:mod:`.hook`) to that worker's
:class:`~.plane.DataPlane` where both ends have one. The wire is :mod:`.wire`.
"""

from .hook import PLUGIN_NAME, counters, plane_of
from .plugin import DataPlanePlugin

__all__ = ["PLUGIN_NAME", "DataPlanePlugin", "counters", "plane_of"]
