"""The worker plugin that gives each worker over UCX its end of the data plane, registered
with the other plugins by whatever opens the cluster (``spillway.launch``): the
scheduler hands it to workers that join later too."""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import WorkerPlugin

from . import hook
from .hook import PLUGIN_NAME, plane_of
logger = logging.getLogger("spillway.dataplane")


class DataPlanePlugin(WorkerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        import secrets

        #: this worker's plane (the plugin is unpickled once a worker): what the gathers
        #: and the collective reach it by (:func:`~.hook.plane_of`)
        self.plane = None
        self._gpu_plane = None
        #: made where the plugin is made (the client that opens the cluster) and carried to
        #: every worker with it: the planes of one cluster share it, a stranger lacks it
        self.secret = secrets.token_hex(32)

    async def setup(self, worker):
        from .plane import DataPlane

        if not worker.address.startswith(("ucx://", "ucxx://")) or self.plane is not None:
            return  # over TCP the comm is the only path (no CUDA IPC to gain)
        if not hook.install():
            return  # this distributed gathers otherwise: the plane is off (the log said why)
        try:
            plane = await DataPlane(worker, self.secret).start()
        except Exception as e:  # noqa: BLE001 (no listener: the worker runs on its comm)
            logger.warning("data plane off on %s: no listener (%s: %s)", worker.address, type(e).__name__, e)
            hook.uninstall()
            return
        if _gpu_worker():
            plane.gpu = True
            self._gpu_plane = plane  # device values: mark where their kernels end
        worker.handlers["dataplane_contact"] = plane.contact
        self.plane = plane
        # endpoints to the peers up now, opened in the background: first contact between
        # workers that start together is not paid inside a gather
        plane.warm_soon()

    def transition(self, key, start, finish, **kwargs):
        plane = self._gpu_plane
        if plane is None:
            return
        if finish == "memory" and start == "executing":
            plane.computed(key)
        elif finish in ("released", "forgotten", "error"):
            plane.released(key)

    def teardown(self, worker):
        plane, self.plane, self._gpu_plane = self.plane, None, None
        worker.handlers.pop("dataplane_contact", None)
        if plane is not None:
            plane.close()
        hook.uninstall()


#: seconds a new cluster waits for its planes to have their endpoints and, on GPUs, each
#: peer's pool mapped: on two H200s mapping a peer's pool took 1.7-2.0 s, paid inside the
#: first exchange where the cluster did not wait
READY_TIMEOUT_S = 60.0


async def plane_ready(dask_worker, timeout: float = READY_TIMEOUT_S) -> int | None:
    """The peers this worker's plane has an endpoint to, once its warm-up is done
    (:meth:`~.plane.DataPlane.ready`); None on a worker without a plane."""
    plane = plane_of(dask_worker)
    if plane is None:
        return None
    return await plane.ready(timeout)


def _gpu_worker() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 (no CuPy or no device: a CPU worker)
        return False
