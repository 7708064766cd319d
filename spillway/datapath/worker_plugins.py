"""A worker's plugin added by the first task that needs it, with the handlers it answers
on: a worker of any cluster can run the data path's tasks without registering anything.

Both happen on the worker's event loop, which reads its plugins and handlers: nothing
awaits between the check and the plugin in place, so a second task's add finds it.
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
