"""Modules a GPU process of a cluster imports on a thread of its own while it starts, so that
the first thing needing them does not import them on the process's event loop.

Why: on two H200s, py-spy of a fresh cluster's start (``benchmarks/results/2x-nvidia-h200-2026-11-28-s18-logs.tar.gz``)
found each worker's event loop importing for seconds inside the start:

- the first CuPy value a worker serializes (the results path's warm-up, else a run's first
  result) makes distributed register its CuPy serializers, which imports
  ``distributed.protocol.cupy``: numba (through ``distributed.protocol.rmm``) and
  ``cupyx.scipy.sparse`` (scipy), 1-7 s a worker, longest with four workers importing at once;
  the client paid the same on its first CuPy result (0.3-0.9 s);
- the worker plugin's zarr host buffer imported zarr, about 1 s a worker.

A worker starts the thread when its store is built (:func:`~.worker_store.build_store`), seconds
before the cluster's first request reaches it; the client starts it once the plan says GPUs.
Work that needs a module the thread has not finished waits on the import lock, as long as it
would have taken to import it itself; :func:`ready` waits for one module without the import.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time

logger = logging.getLogger(__name__)

#: a GPU worker's: zarr first (the worker plugin's host buffer wants it first), then CuPy's
#: serializers, which every device value that leaves the worker needs
WORKER = ("zarr", "distributed.protocol.cupy")
#: the client's: the results it receives are CuPy values
CLIENT = ("distributed.protocol.cupy",)


class Warmup:
    """One process's warm imports (the module's functions use the process's one)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._imported: dict[str, threading.Event] = {}
        self.took: dict[str, float] = {}

    def start(self, modules: tuple[str, ...]) -> threading.Thread:
        """Import ``modules`` in order on a daemon thread, once (a second call returns the
        first call's thread). A module that fails to import is a debug line here; whoever
        imports it later meets the error as they would have."""
        with self._lock:
            if self._thread is None:
                for name in modules:
                    self._imported.setdefault(name, threading.Event())
                self._thread = threading.Thread(target=self._run, args=(tuple(modules),),
                                                name="spillway-warm-imports", daemon=True)
                self._thread.start()
            return self._thread

    def _run(self, modules: tuple[str, ...]) -> None:
        for name in modules:
            began = time.perf_counter()
            try:
                importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 (a warm-up: the module's user meets the error)
                logger.debug("warming %s failed: %s: %s", name, type(e).__name__, e)
            finally:
                self.took[name] = time.perf_counter() - began
                self._imported[name].set()
        logger.debug("warm imports took %s", ", ".join(f"{k} {v:.2f} s" for k, v in self.took.items()))

    def ready(self, name: str, timeout: float = 0.0) -> bool:
        """Whether nothing is left to wait for before ``name`` is used: True where no warm-up
        takes that module or it is imported (waiting up to ``timeout`` seconds for it)."""
        event = self._imported.get(name)
        return event is None or event.wait(timeout)


_process = Warmup()


def start(modules: tuple[str, ...]) -> threading.Thread:
    """:meth:`Warmup.start` of this process."""
    return _process.start(modules)


def ready(name: str, timeout: float = 0.0) -> bool:
    """:meth:`Warmup.ready` of this process."""
    return _process.ready(name, timeout)
