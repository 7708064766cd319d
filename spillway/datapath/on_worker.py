"""What the data path's tasks do on a worker from their own thread: reach its event loop,
add a plugin the first time one is needed, and keep values in its store.

A plugin is added, with the handlers it answers on, by the first task that needs it: a
worker of any cluster can run the data path's tasks without registering anything. Both
happen on the worker's event loop, which reads its plugins and handlers: nothing awaits
between the check and the plugin in place, so a second task's add finds it.
"""

from __future__ import annotations


def on_loop(worker, fn, *args):
    """``fn(*args)`` (a coroutine function) on the worker's event loop, from a task's thread."""
    from distributed.utils import sync

    return sync(worker.loop, fn, *args)


def plugin_of(worker, name: str, make):
    """The worker's plugin ``name``; where it has none, ``make(worker)`` gives ``(plugin,
    handlers, stream handlers)`` and they are added."""
    found = getattr(worker, "plugins", {}).get(name)
    return found if found is not None else on_loop(worker, _add, worker, name, make)


async def _add(worker, name: str, make):
    if name not in worker.plugins:
        plugin, handlers, stream_handlers = make(worker)
        worker.handlers.update(handlers)
        worker.stream_handlers.update(stream_handlers)
        await worker.plugin_add(plugin, name=name)
    return worker.plugins[name]


def keep(worker, values: dict) -> None:
    """``values`` (key -> value) in the worker's store. Spillway's tiered store takes them
    from any thread (it spills under its own lock): no trip through the event loop, which
    serves the peers meanwhile; another store (distributed's, dask-cuda's) on the loop."""
    from spillway.memory.store import TieredStore

    if isinstance(worker.data, TieredStore):
        for key, value in values.items():
            worker.data[key] = value
        return
    on_loop(worker, _keep, worker, values)


async def _keep(worker, values: dict) -> None:
    for key, value in values.items():
        worker.data[key] = value
