"""A GPU process of a cluster imports what its first requests need on a thread of its own
while it starts (:mod:`spillway.launch.warm_imports`), not on its event loop."""

import asyncio
import sys
import textwrap
import threading
import time

import pytest

from spillway.launch import warm_imports
from spillway.launch.warm_imports import Warmup


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    """A module that takes 0.5 s to import, and a module that fails to."""
    (tmp_path / "spillway_slow_to_import.py").write_text("import time\ntime.sleep(0.5)\nVALUE = 7\n")
    (tmp_path / "spillway_fails_to_import.py").write_text("raise RuntimeError('not here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "spillway_slow_to_import", "spillway_fails_to_import"
    for name in ("spillway_slow_to_import", "spillway_fails_to_import"):
        sys.modules.pop(name, None)


def test_modules_import_on_a_thread_of_their_own_and_ready_waits_for_each(slow_module):
    slow, fails = slow_module
    warm = Warmup()
    began = time.perf_counter()
    thread = warm.start((slow, fails))
    assert time.perf_counter() - began < 0.3  # the caller goes on while they import
    assert thread.name == "spillway-warm-imports" and thread.daemon and thread is not threading.current_thread()
    assert not warm.ready(slow)  # not in yet
    assert warm.ready(slow, timeout=10) and sys.modules[slow].VALUE == 7
    assert warm.ready(fails, timeout=10)
    thread.join(10)
    # a module that fails is the warm-up's debug line, not an error; its user meets the error
    assert warm.ready(fails) and fails not in sys.modules
    assert set(warm.took) == {slow, fails} and warm.took[slow] >= 0.4
    assert warm.start(("json",)) is thread  # once a process


def test_nothing_waits_on_a_module_no_warm_up_takes():
    warm = Warmup()
    assert warm.ready("zarr")
    warm.start(("json",))
    assert warm.ready("zarr") and warm.ready("json", timeout=10)


def test_the_worker_installs_zarrs_host_buffer_once_the_thread_has_zarr(monkeypatch):
    """Where zarr is still being imported on the thread when the worker plugin sets up, the
    plugin's set-up awaits it (distributed sets a plugin up before the worker takes tasks) and
    installs the buffer then, without importing on the event loop."""
    import zarr

    from spillway.launch import plugins
    from spillway.memory import zarr_buffer

    warm = Warmup()
    gate = threading.Event()
    warm._imported["zarr"] = gate  # as if the thread were still importing zarr
    monkeypatch.setattr(warm_imports, "_process", warm)
    before = zarr.config.get("ndbuffer")

    async def set_up():
        task = asyncio.ensure_future(plugins._zarr_buffer_when_imported())
        await asyncio.sleep(0.2)
        waiting = not task.done() and not zarr_buffer.installed()
        gate.set()
        await asyncio.wait_for(task, 10)
        return waiting

    try:
        assert not warm_imports.ready("zarr")
        assert asyncio.run(set_up())
        assert zarr_buffer.installed()
    finally:
        zarr.config.set({"ndbuffer": before})


def test_a_gpu_workers_store_starts_the_worker_warm_up(monkeypatch):
    from spillway.launch import worker_store

    started = []
    monkeypatch.setattr(worker_store, "tiered_store", lambda **kw: "the store")
    monkeypatch.setattr(warm_imports, "start", lambda modules: started.append(modules))
    assert worker_store.build_store(worker_local_directory="/tmp", protocol="tcp://") == "the store"
    assert started == [warm_imports.WORKER]
    # zarr first: the worker plugin's buffer waits for it; then CuPy's serializers
    assert warm_imports.WORKER[0] == "zarr" and "distributed.protocol.cupy" in warm_imports.WORKER
    assert warm_imports.CLIENT == ("distributed.protocol.cupy",)


def test_the_process_warm_up_in_a_fresh_interpreter(tmp_path):
    """The module's own functions, in a process of their own: the imports run off the main
    thread, in order, and ready() returns once the last is in."""
    import subprocess

    script = textwrap.dedent("""
        import sys, threading
        from spillway.launch import warm_imports
        seen = []
        real = __import__('importlib').import_module
        def record(name):
            seen.append(threading.current_thread().name)
            return real(name)
        __import__('importlib').import_module = record
        warm_imports.start(("json", "email.mime.text"))
        assert warm_imports.ready("email.mime.text", timeout=30) and "email.mime.text" in sys.modules
        assert seen == ["spillway-warm-imports"] * 2, seen
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
