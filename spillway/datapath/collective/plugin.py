"""The worker plugin that holds a worker's collective state (:class:`.state.CollectiveState`).

The first collective task on a worker adds it (:mod:`.exchange`), with the handlers a
holder answers with: a worker of any cluster can run a collective, without registering
anything. Its teardown drops what is left of every exchange when the worker closes.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin

from .state import WORKER_PLUGIN, CollectiveState


class CollectiveWorker(WorkerPlugin):
    name = WORKER_PLUGIN

    def __init__(self):
        self.state = CollectiveState()

    def teardown(self, worker) -> None:
        self.state.close()
