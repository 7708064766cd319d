"""The worker plugin that gives each worker over UCX its end of the data plane, registered
with the other plugins by whatever opens the cluster (``spillway.cluster.launch``): the
scheduler hands it to workers that join later too."""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import WorkerPlugin

from . import hook

PLUGIN_NAME = "spillway-dataplane"
logger = logging.getLogger("spillway.dataplane")


class DataPlanePlugin(WorkerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    async def setup(self, worker):
        from .plane import DataPlane

        if not worker.address.startswith(("ucx://", "ucxx://")) or worker.address in hook.PLANES:
            return  # over TCP the comm is the only path (no CUDA IPC to gain)
        plane = await DataPlane(worker).start()
        worker.handlers["dataplane_contact"] = plane.contact
        hook.PLANES[worker.address] = plane
        hook.install()

    def teardown(self, worker):
        plane = hook.PLANES.pop(worker.address, None)
        worker.handlers.pop("dataplane_contact", None)
        if plane is not None:
            plane.close()
        hook.uninstall()
