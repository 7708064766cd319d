"""The contract with upstream: each seam of spillway/upstream.py (a part of dask,
distributed, dask-cuda, distributed-ucxx, ucxx, zict, dask-jobqueue or zarr that upstream does
not promise to keep) still has the shape its adapter expects, in the releases installed.

A dependency bump that changes one fails the test named after that seam here, not a
user's run. Seams of a distribution that is not installed skip (dask-cuda off the GPU
hosts, UCXX outside the data plane's venv). Then: the installed releases are those the
seams were checked against and bounded in pyproject at the next minor release; nothing
outside the seam module reads or writes the private parts or the internal ones (outside
spillway/upstream.py a private name of another package, a name of ``upstream.INTERNAL`` or
any attribute of distributed's task, worker and client states fails, naming file:line; the
exceptions allowed are Python's own, listed in ``upstream.PRIVATE_OUTSIDE``); and each
adapter does what spillway relies on with the real upstream in place.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from pathlib import Path

import pytest

from spillway import upstream

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(upstream.SEAMS))
def test_seam_has_the_shape_spillway_expects(name):
    seam = upstream.SEAMS[name]
    try:
        why = seam.check()
    except ImportError as e:
        pytest.skip(f"{seam.package} is not installed ({e})")
    assert why is None, f"{seam.upstream} ({seam.package} {upstream.version_of(seam.package)}): {why}"


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


@pytest.mark.parametrize("package", sorted({s.package for s in upstream.SEAMS.values()}))
def test_the_installed_release_is_one_the_seams_were_checked_against(package):
    installed = upstream.version_of(package)
    if installed == "not installed":
        pytest.skip(f"{package} is not installed")
    checked = {v for s in upstream.SEAMS.values() if s.package == package for v in s.checked}
    assert _minor(installed) in {_minor(v) for v in checked}, (
        f"{package} {installed} was not checked: run this file's seam tests on it and add it to the checked "
        f"releases in spillway/upstream.py (checked: {sorted(checked)})")


def _requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        out += extra
    return out


#: the distributions spillway reaches past their public API (spillway/upstream.py's seams):
#: each bounded above; numpy, cupy and kvikio are used through their public API alone
BOUNDED = ("dask", "distributed", "dask-cuda", "distributed-ucxx", "ucxx", "dask-jobqueue", "zarr", "zict", "rmm",
           "dask-mpi")
#: RAPIDS' releases are year.month, every other month (26.10, 26.12, 27.02); dask's are
#: year.month (2026.8, 2026.9, ..., 2027.1); the others' next minor is minor + 1
RAPIDS = ("dask-cuda", "rmm", "kvikio")
CALENDAR = ("dask", "distributed", "dask-mpi")


def next_minor(package: str, version):
    """The first release of ``package`` past ``version``'s minor (its next minor release)."""
    from packaging.version import Version

    major, minor = version.major, version.minor
    step = 2 if package in RAPIDS else 1
    if package in RAPIDS + CALENDAR and minor + step > 12:
        return Version(f"{major + 1}.{minor + step - 12}")
    return Version(f"{major}.{minor + step}")


def test_the_next_minor_release_follows_each_distributions_numbering():
    from packaging.version import Version

    assert next_minor("zarr", Version("3.4.2")) == Version("3.5")
    assert next_minor("dask", Version("2026.8.0")) == Version("2026.9")
    assert next_minor("dask", Version("2026.12.1")) == Version("2027.1")
    assert next_minor("dask-cuda", Version("26.10.0")) == Version("26.12")
    assert next_minor("dask-cuda", Version("26.12.0")) == Version("27.2")
    assert next_minor("ucxx", Version("0.52.0")) == Version("0.53")


def test_pyproject_bounds_each_seamed_dependency_at_the_next_minor_after_the_newest_checked():
    """Each seamed distribution's upper bound is the next minor release after the newest
    one its seams were read against: one lower shuts out a release checked, one higher lets
    in a release nobody read (zarr ``<3.6`` with 3.4 read lets 3.5 in)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    seen = set()
    for line in _requirements():
        requirement = Requirement(line)
        base = re.sub(r"-cu1[0-9]$", "", requirement.name)
        if base not in BOUNDED:
            continue
        seen.add(base)
        uppers = [Version(s.version) for s in requirement.specifier if s.operator == "<"]
        assert uppers, f"{line}: no upper bound"
        checked = [Version(v) for s in upstream.SEAMS.values() if s.package == base for v in s.checked]
        if checked:
            newest = max(checked)
            assert uppers[0] == next_minor(base, newest), (
                f"{line}: the seams of {base} were read on releases up to {newest}: bound it at "
                f"<{next_minor(base, newest)}")
    assert seen == set(BOUNDED)


def test_every_seamed_distribution_is_bounded():
    assert {s.package for s in upstream.SEAMS.values()} <= set(BOUNDED)


#: the private names of upstream that spillway uses; only the seam module may name them
PRIVATE = ("_materialize_graph", "get_data_from_worker", "_instances", "transfer_outgoing", "peekn",
           "_job_script_prologue", "_command_template", "_adaptive", "new_spec", "init_once", "_cuda_context",
           "dask._expr", "dask._task_spec", "OFFLOAD_THRESHOLD", "fast_to_slow_callbacks", "ProgressTasks",
           "_progress_timeout", ".lock")


def test_only_the_seam_module_names_upstream_private_parts():
    seam = ROOT / "spillway" / "upstream.py"
    found = []
    for path in sorted((ROOT / "spillway").rglob("*.py")):
        if path == seam:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {name}" for name in PRIVATE if name in text]
    assert not found, found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


_ACCESSORS = ("getattr", "hasattr", "setattr", "delattr")


def _named_attribute(node) -> str | None:
    """The attribute name ``node`` reads or writes: ``x._name``, or ``getattr(x, "_name")``
    and its kin with a literal name."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ACCESSORS
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


def _on_itself(node) -> bool:
    """Whether ``node`` (an attribute, or a setattr) is on ``self`` or ``cls``."""
    target = node.value if isinstance(node, ast.Attribute) else node.args[0]
    return isinstance(target, ast.Name) and target.id in ("self", "cls")


def spillways_own_private_names(trees) -> set[str]:
    """Underscore attributes spillway defines on its own objects: the members of its
    classes (methods, class attributes, fields) and what its methods assign to ``self``
    or ``cls`` (``self._lock = ...``); a private attribute spillway reads or writes that is
    not among them is another package's. A module's own functions and globals do not
    count (``executor._threads`` is not spillway's ``_threads()``), nor does an attribute
    set on another object (``server._mine = ...`` writes onto that object's class)."""
    own = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        own.add(member.name)
                    elif isinstance(member, (ast.Assign, ast.AnnAssign)):
                        targets = member.targets if isinstance(member, ast.Assign) else [member.target]
                        own.update(t.id for t in targets if isinstance(t, ast.Name))
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del))
                  and _on_itself(node)):
                own.add(node.attr)
            elif (isinstance(node, ast.Call) and _named_attribute(node) and node.func.id == "setattr"
                  and _on_itself(node)):
                own.add(node.args[1].value)
    return {n for n in own if _private(n)}


def upstream_private_uses(sources: dict[str, str], allowed) -> list[str]:
    """``path:line name`` of each use of another package's private name in ``sources``
    (path -> text): an attribute spillway does not define, read by name or by a literal
    in getattr and its kin, and imports of a private name or module of another package;
    the names in ``allowed`` pass."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    own = spillways_own_private_names(trees.values())
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            name = _named_attribute(node)
            if name is not None and _private(name) and name not in own and name not in allowed:
                found.append(f"{path}:{node.lineno} {name}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and not node.module.startswith("spillway"):
                modules = node.module.split(".")
                for alias in node.names:
                    if any(map(_private, modules)) or (_private(alias.name) and alias.name not in allowed):
                        found.append(f"{path}:{node.lineno} from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if not alias.name.startswith("spillway") and any(map(_private, alias.name.split("."))):
                        found.append(f"{path}:{node.lineno} import {alias.name}")
    return found


#: the distributions whose internal names only the seam module may use (their import names)
UPSTREAM = ("dask", "distributed", "dask_cuda", "distributed_ucxx", "ucxx", "rmm", "zarr", "kvikio", "zict",
            "dask_jobqueue")


def _receiver(node) -> str | None:
    """The name of the object an attribute is read on: ``x`` of ``x.a``, ``b`` of
    ``x.b.a`` and of ``getattr(x.b, "a")``; None where it is no name (a call's result)."""
    target = node.value if isinstance(node, ast.Attribute) else node.args[0]
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def upstream_internal_uses(sources: dict[str, str], internal: dict, holders=upstream.STATE_HOLDERS) -> list[str]:
    """``path:line receiver.name`` of each read or write, in ``sources`` (path -> text), of
    a name of ``internal`` (name -> None: on any object; or the receivers it counts on)
    and of any attribute of an object named as one of ``holders`` (distributed's TaskState,
    WorkerState, ClientState), by attribute or by a literal in getattr and its kin; and
    ``path:line from module import name`` of an import of an internal name from an upstream
    distribution (:data:`UPSTREAM`)."""
    found = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            name = _named_attribute(node)
            if name is not None:
                receiver = _receiver(node)
                receivers = internal.get(name, ())
                if receiver == "upstream":  # an adapter of the seam module
                    continue
                if receiver in holders or receivers is None or receiver in (receivers or ()):
                    found.append(f"{path}:{node.lineno} {receiver}.{name}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in UPSTREAM:
                found += [f"{path}:{node.lineno} from {node.module} import {alias.name}" for alias in node.names
                          if alias.name in internal and internal[alias.name] is None]
    return found


def _product_sources() -> dict[str, str]:
    """Every module of spillway but the seam module, by its path from the repository."""
    seam = ROOT / "spillway" / "upstream.py"
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "spillway").rglob("*.py")) if p != seam}


def _with_planted(check, names, planted: str) -> tuple[list, list]:
    """What ``check`` finds in spillway's modules, and what more it finds once a module
    ``spillway/planted.py`` of text ``planted`` is among them."""
    sources = _product_sources()
    before = check(sources, names)
    sources["spillway/planted.py"] = planted
    return before, [f for f in check(sources, names) if f not in before]


def test_no_private_upstream_name_is_used_outside_the_seam_module():
    found = upstream_private_uses(_product_sources(), upstream.PRIVATE_OUTSIDE)
    assert not found, ("private names of other packages outside spillway/upstream.py: give each a seam "
                       "there (or, for one of Python's own, an entry in upstream.PRIVATE_OUTSIDE): " + "; ".join(found))


@pytest.mark.parametrize("planted", [
    "def f(cluster):\n    return cluster._correct_state_waiting\n",
    "def f(worker):\n    return getattr(worker, '_pending_data_per_worker', None)\n",
    "from distributed.scheduler import _materialize_graph\n",
    "from dask._task_spec import Task\n",
    "import distributed._concurrent_futures_thread\n",
    "def _threads():\n    return 1\n\ndef f(executor):\n    return getattr(executor, '_threads', ())\n",
    "def f(server, settler):\n    server._spillway_settler = settler\n",
], ids=["attribute", "getattr", "private-name", "private-module", "import-module", "named-like-own-function",
        "write-onto-upstream"])
def test_the_private_name_check_fails_on_a_planted_use(planted):
    before, found = _with_planted(upstream_private_uses, upstream.PRIVATE_OUTSIDE, planted)
    assert not before
    assert len(found) == 1 and found[0].startswith("spillway/planted.py:"), found


def test_no_internal_upstream_name_is_used_outside_the_seam_module():
    found = upstream_internal_uses(_product_sources(), upstream.INTERNAL)
    assert not found, ("internal names of upstream outside spillway/upstream.py: read or write each through an "
                       "adapter there (upstream.INTERNAL lists them): " + "; ".join(found))


@pytest.mark.parametrize("planted", [
    "def f(scheduler):\n    return scheduler.tasks\n",
    "def f(self):\n    return self.scheduler.workers\n",
    "def f(worker):\n    return worker.state.tasks.get(1)\n",
    "def f(ts):\n    return ts.dependents\n",
    "def f(anything):\n    return anything.who_has\n",
    "def f(t):\n    return getattr(t, 'run_spec', None)\n",
    "def f(t, address):\n    t.worker_restrictions = {address}\n",
    "from distributed.threadpoolexecutor import thread_state\n",
], ids=["scheduler-tasks", "self-scheduler", "worker-state", "task-state", "any-object", "getattr", "write",
        "import"])
def test_the_internal_name_check_fails_on_a_planted_use(planted):
    _, found = _with_planted(upstream_internal_uses, upstream.INTERNAL, planted)
    assert found and all(f.startswith("spillway/planted.py:") for f in found), found


def test_spillways_own_word_on_its_own_object_passes_the_internal_check():
    own = ("class Job:\n    def __init__(self):\n        self.state = 'queued'\n        self.tasks = []\n"
           "def f(job, jobs):\n    return job.state, job.tasks, jobs.running\n")
    assert upstream_internal_uses({"spillway/own.py": own}, upstream.INTERNAL) == []


def test_a_private_name_spillway_defines_itself_passes_the_check():
    own = "class A:\n    def __init__(self):\n        self._lock = 1\n\ndef f(a):\n    return a._lock\n"
    assert upstream_private_uses({"spillway/own.py": own}, {}) == []
    assert upstream_private_uses({"spillway/own.py": own + "def g(n):\n    return n._spec\n"}, {}) == [
        "spillway/own.py:8 _spec"]


def test_no_bare_except_in_the_product():
    """A bare ``except:`` swallows what a renamed upstream raises (AttributeError) with the
    rest: the seam's adapters catch the error they mean and say when a seam is off."""
    found = [f"{path}:{node.lineno}" for path, text in _product_sources().items()
             for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ExceptHandler) and node.type is None]
    assert not found, found


# --- each adapter against the real upstream


def test_the_graph_materialization_wrapper_adds_sizes_and_hands_back_distributeds_result():
    import dask.array as da
    import distributed.scheduler as ds
    from dask.base import collections_to_expr

    from spillway.memory.capacity import install_sizes, uninstall_sizes
    from spillway.memory.graph_bytes import NBYTES

    before = ds._materialize_graph
    expr = collections_to_expr([da.ones((4, 4), chunks=2)], True).optimize()
    plain = before(expr=expr, validate=False)
    assert install_sizes()
    try:
        dsk, annotations = ds._materialize_graph(expr=expr, validate=False)
    finally:
        uninstall_sizes()
    assert ds._materialize_graph is before
    assert set(dsk) == set(plain[0])
    assert set(annotations[NBYTES].values()) == {32}


def test_gathers_are_routed_and_given_back():
    import distributed.worker

    before = distributed.worker.get_data_from_worker

    async def routed(rpc, keys, worker, *, who=None, serializers=None, deserializers=None):
        return None

    original = upstream.route_gathers(routed)
    try:
        assert original is before and distributed.worker.get_data_from_worker is routed
    finally:
        upstream.unroute_gathers(original)
    assert distributed.worker.get_data_from_worker is before


def test_the_worker_queue_reads_soonest_first():
    from distributed.worker_state_machine import WorkerState

    state = WorkerState()
    assert upstream.queued_tasks(state, 4) == []


def test_the_send_limit_doubles_for_a_requester_on_the_same_host_as_distributed_does():
    from types import SimpleNamespace

    worker = SimpleNamespace(address="tcp://10.0.0.1:4000", status=SimpleNamespace(name="running"),
                             transfer_outgoing_count_limit=2, transfer_outgoing_count=3,
                             transfer_outgoing_count_total=0, transfer_outgoing_bytes=0,
                             transfer_outgoing_bytes_total=0, transfer_outgoing_log=[])
    assert upstream.outgoing_at_limit(worker, "tcp://10.0.0.2:4001")  # another host: 2
    assert not upstream.outgoing_at_limit(worker, "tcp://10.0.0.1:4001")  # this host: 4
    worker.status.name = "paused"
    worker.transfer_outgoing_count = 1
    assert upstream.outgoing_at_limit(worker, "tcp://10.0.0.1:4001")  # paused: 1


def test_zict_buffers_give_their_callback_lists():
    import zict

    buffer = zict.Buffer({}, {}, 1)
    assert upstream.spill_callbacks(buffer) == (buffer.fast_to_slow_callbacks, buffer.slow_to_fast_callbacks)
    assert upstream.spill_callbacks({}) is None


def test_the_memory_limit_is_read_without_importing_distributed_and_agrees_with_it():
    from distributed.system import memory_limit

    assert upstream.system_memory_limit() == memory_limit()


def test_the_client_process_starts_ucx_with_every_transport_but_ipc():
    """UCX in the client's process as spillway starts it (launch/ucx_env.py), in a process of
    its own: UCX starts once a process. Its transports exclude CUDA IPC, whose mappings
    UCX 1.21 keeps until the process exits (a closed cluster's pools held)."""
    pytest.importorskip("ucxx")
    pytest.importorskip("distributed_ucxx")
    import subprocess
    import sys

    code = ("from spillway.launch.ucx_env import start_client_ucx; start_client_ucx(gpu=False); "
            "import ucxx, dask.config; print(ucxx.get_config()['TLS']); "
            "print(dask.config.get('distributed-ucxx.environment', default=None))")
    env = {k: v for k, v in os.environ.items() if k != "UCX_TLS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    tls, environment = done.stdout.strip().splitlines()[-2:]
    assert tls == "^cuda_ipc"
    assert "cuda_ipc" not in environment  # the setting was the start's alone


def test_the_progress_net_is_tightened_on_every_loop_ucxx_progresses():
    """ucxx's blocking progress mode, as distributed-ucxx starts it in a worker, with its
    safety net brought from 1 s to the setting given, on the loop a listener started."""
    ucxx = pytest.importorskip("ucxx")
    pytest.importorskip("distributed_ucxx")
    import asyncio

    from ucxx._lib_async import application_context

    upstream.start_ucx()  # as a worker's comm does, once a process

    async def listen():
        listener = ucxx.create_listener(lambda ep: None, port=0)
        try:
            found = upstream.tighten_progress_net(0.004)
            task = application_context.ProgressTasks.get(asyncio.get_running_loop())
            return found, getattr(task, "_progress_timeout", None)
        finally:
            listener.close()

    found, timeout = asyncio.run(listen())
    assert found >= 1 and timeout == 0.004


def _jobs(fails: bool):
    """A ProcessInterface whose start counts itself and leaves it failed or running."""
    import asyncio

    from distributed.core import Status
    from distributed.deploy.spec import ProcessInterface

    class Job(ProcessInterface):
        starts = 0

        async def start(self):
            Job.starts += 1
            await asyncio.sleep(0.01)  # both awaits below are inside the lock's section at once
            self.status = Status.failed if fails else Status.running

        def __await__(self):
            return upstream.start_once(self)

    return Job


@pytest.mark.parametrize("fails", [False, True], ids=["started", "refused"])
def test_a_job_awaited_twice_starts_once_under_distributeds_lock_and_may_end_failed(fails):
    import asyncio

    from distributed.core import Status

    Job = _jobs(fails)

    async def main():
        job = Job()
        held = asyncio.Event()

        async def hold():  # distributed's lock is the one taken: while held, no start
            async with job.lock:
                held.set()
                await asyncio.sleep(0.05)
                assert Job.starts == 0

        holder = asyncio.create_task(hold())
        await held.wait()
        first, second = await asyncio.gather(job, job)
        await holder
        return job, first, second

    job, first, second = asyncio.run(main())
    assert first is job and second is job and Job.starts == 1
    assert job.status == (Status.failed if fails else Status.running)


def test_the_state_readers_read_a_real_scheduler_and_worker():
    """The adapters over distributed's scheduler and worker state, on an in-process
    cluster: what spillway's plugins read of them through the seam."""
    from distributed import Client, LocalCluster, wait

    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        a = client.submit(lambda: b"x" * 1000, key="a")
        b = client.submit(lambda v: len(v), a, key="b")
        wait([a, b])
        scheduler, worker = cluster.scheduler, next(iter(cluster.workers.values()))
        address = worker.address
        assert upstream.key_state(scheduler, "a") == "memory" and upstream.key_state(scheduler, "nope") is None
        assert upstream.key_nbytes(scheduler, "a") >= 1000 and upstream.key_nbytes(scheduler, "nope") == 0
        assert upstream.dependency_keys(scheduler, "b") == ["a"] and upstream.dependent_keys(scheduler, "a") == ["b"]
        assert upstream.task_holders(upstream.scheduler_task(scheduler, "a")) == {address}
        assert upstream.dependency_holders(upstream.scheduler_task(scheduler, "b")) == {address}
        assert upstream.worker_addresses(scheduler) == [address] == upstream.worker_addresses(scheduler, running=True)
        assert upstream.has_worker(scheduler, address) and not upstream.has_worker(scheduler, "tcp://nowhere:1")
        assert upstream.worker_metric(scheduler, "no-such-metric") == {address: None}
        assert upstream.worker_memory_limits(scheduler)[address] >= 0
        assert upstream.held_bytes(scheduler) >= 1000
        assert upstream.keys_on_worker(scheduler, address) == {"a", "b"}
        assert upstream.client_known(scheduler, client.id)
        assert set(upstream.client_wanted_keys(scheduler, client.id)) == {"a", "b"}
        assert upstream.client_wanted_keys(scheduler, "no-such-client") is None
        keys, priorities = upstream.waiting_priorities(scheduler, address)
        assert set(keys) == {"a", "b"} and priorities == [None, None]  # nothing waits for them
        assert not upstream.scheduler_busy(scheduler)
        assert upstream.alias_target(scheduler, "a") is None
        assert upstream.worker_key_nbytes(worker, "a") >= 1000 and upstream.worker_key_nbytes(worker, "nope") == 0
        assert upstream.keys_in_use(worker) == set() and upstream.tasks_executing(worker) == 0
        assert upstream.local_readers_rank(worker)("a") is None  # its reader is done
        peak, rss = upstream.process_memory(worker, 0.0)
        assert peak >= rss > 0
        assert upstream.worker_memory_limit(worker) == worker.memory_manager.memory_limit

        def inside():
            from distributed import secede

            before = upstream.in_task_thread()
            secede()
            return before, upstream.in_task_thread()

        assert client.submit(inside, pure=False).result() == (True, False)
        assert not upstream.in_task_thread()
