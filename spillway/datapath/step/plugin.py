"""The worker plugin that holds a worker's :class:`.state.StepState`: added by the first
step on a worker (:mod:`.task`), so that a worker of any cluster can run one; its teardown
closes the worker's transports."""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin

from .state import WORKER_PLUGIN, StepState


class StepWorker(WorkerPlugin):
    name = WORKER_PLUGIN

    def __init__(self):
        self.state = StepState()

    def teardown(self, worker) -> None:
        self.state.close()
