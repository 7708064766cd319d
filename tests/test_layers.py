"""The house in layers: every module of ``spillway`` imports only from its own layer and
the layers its layer names as used, which all sit below it.

The imports are read from the source (``ast``), not by importing: ``import x``,
``from x import y`` (``y`` taken as the submodule ``x.y`` where there is one), relative
imports resolved against the module's package, and imports inside functions and
``if TYPE_CHECKING:`` blocks alike (a lazy import is a dependency all the same). There is
no exception list: a module that needs something from above moves, or has it passed in.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "spillway"


@dataclass(frozen=True)
class Layer:
    name: str
    #: the one package that holds the layer (its modules are it and everything under it)
    package: str
    #: the lower layers this one may import from (its own always)
    uses: tuple[str, ...]
    why: str


#: Lowest first, one package (or module) each: the rooms of ``spillway``, each named for
#: what it holds. The top package holds two modules of its own, named in TOP; any other
#: module outside these rooms fails :func:`test_every_module_has_a_layer`. ``uses`` is what
#: each room imports today, read from the source: a new import between rooms is added here
#: with its reason, and one that would run up moves its module instead. The benchmarks are
#: no room: a distribution of their own (``benchmarks/spillway_bench``) that only the CLI's
#: bench commands import, when they run.
LAYERS = (
    Layer("seam", "spillway.upstream", (),
          "The one module of hooks into dependencies' private names (dask, distributed, "
          "dask-cuda, UCXX, zict, dask-jobqueue), each an adapter with the releases it was "
          "checked against and a fallback; it imports nothing of spillway, so every room "
          "may reach upstream through it and none around it."),
    Layer("options", "spillway.options", (),
          "The settings and the facts they are resolved against: Options and its config, "
          "the generated schema and docs, byte sizes, GPU discovery, the user-facing errors. "
          "Every room reads them; they read no other room."),
    Layer("memory", "spillway.memory", ("seam", "options"),
          "The tiered store on each worker (device, pinned host, disk), its accounting and "
          "eviction, admission by projected footprint, the scheduler plugin that holds "
          "every graph to the tiers, and zarr's host buffer for device chunks."),
    Layer("datapath", "spillway.datapath", ("seam", "options", "memory"),
          "Chunks between workers: the data plane over UCXX, the rechunk collective and "
          "which transport the workers use; it moves the store's values, so it sits on the "
          "store."),
    Layer("launch", "spillway.launch", ("seam", "options", "memory", "datapath"),
          "Every launcher of a cluster, one module each behind the Backend protocol (local "
          "GPU, local CPU, attach, a node's workers, MPI ranks, a Slurm batch job, a "
          "notebook's Slurm jobs: LAUNCHERS), what they start decided first (the launch "
          "plan, one WorkerSpec per worker) and rendered by pure functions (dask-cuda's "
          "keywords and flags, command lines, the batch seam's job script), and what every "
          "cluster registers (the worker plugin with the store and the data path, the "
          "collector settler, the worker-loss watch). What it starts elsewhere runs the CLI, "
          "and it knows no workflow: a workflow's resources register their own clean-up with "
          "the worker plugin (plugins.on_teardown), and a launcher is handed the work it runs."),
    Layer("deploy", "spillway.deploy", ("options",),
          "The shared service's systemd unit and environment file, rendered from the options "
          "by plain functions (no launcher: the unit runs `spillway serve`)."),
    Layer("workflows", "spillway.workflows", ("seam", "options", "memory", "datapath", "launch"),
          "Named chunked-array workflows and their Zarr I/O: graphs built from parameters "
          "and a target, raising the options' errors and sizing with its sizes; they run on "
          "any cluster and import nothing that runs them. The Zarr read pool asks the seam "
          "whether its caller's thread is a worker's task thread (it may secede)."),
    Layer("run", "spillway.run", ("seam", "options", "memory", "datapath", "launch", "workflows"),
          "Running a workflow or a user's collection on a cluster: the target read from the "
          "workers, compute, output, verification, progress, the run report and its text, "
          "HTML and figure, and the admission check before a GPU cluster starts (it builds "
          "the workflow's graph). The progress plugin reads the scheduler's tasks through "
          "the seam."),
    Layer("clusters", "spillway.clusters", ("seam", "options", "launch", "workflows", "run"),
          "The clusters of notebooks: spillway.local, spillway.slurm (thin entry points of "
          "the launchers of the launch room) and the base both are, which hand out runs."),
    Layer("service", "spillway.service", ("options", "memory", "launch", "workflows", "run"),
          "The shared service: the HTTP API, the job scheduler and its database, which run "
          "workflows on one cluster for many tenants, and the Python client of that API."),
    Layer("api", "spillway", ("options", "clusters", "service"),
          "The public names (spillway.local, spillway.slurm, spillway.connect, "
          "spillway.Options and the errors): `import spillway` re-exports what users type, "
          "the HTTP client lazily."),
    Layer("cli", "spillway.cli",
          ("options", "datapath", "launch", "workflows", "run", "clusters", "service"),
          "The command line at the top: it starts everything below (serve, worker, run, "
          "slurm, mpi, bench; each launcher's command parses its flags and calls the launcher) "
          "and reports the host (info); the bench commands import the benchmarks' own "
          "distribution when they run."),
)
#: the top package's own modules: its __init__ (the public names) and `python -m spillway`
TOP = {"spillway": "api", "spillway.__main__": "cli"}
RANK = {layer.name: i for i, layer in enumerate(LAYERS)}
BY_NAME = {layer.name: layer for layer in LAYERS}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> Layer:
    if module in TOP:
        return BY_NAME[TOP[module]]
    found = [layer for layer in LAYERS
             if layer.package != "spillway" and (module == layer.package or module.startswith(layer.package + "."))]
    assert found, f"{module} is in no layer: add it to LAYERS"
    return found[0]


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of spillway in ``path``."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(), package, str(path))


def from_target(node: ast.ImportFrom, package: str) -> str:
    """The module ``from ... import`` reads from, relative imports resolved against ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_in(source: str, package: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, imported module) for every import of spillway in ``source``, a module of
    ``package`` (against which relative imports resolve)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = from_target(node, package)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if _is_module(sub) else target))
    return sorted((line, name) for line, name in found if name == "spillway" or name.startswith("spillway."))


MODULES = sorted(PACKAGE.rglob("*.py"))


def import_graph(paths=MODULES) -> dict[str, list[tuple[int, str]]]:
    """module -> (line, imported module) for every spillway module in ``paths``."""
    return {module_name(path): imports(path) for path in paths}


def upward_imports(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    problems = []
    for module, found in sorted(graph.items()):
        layer = layer_of(module)
        for line, name in found:
            used = layer_of(name)
            if used.name == layer.name or used.name in layer.uses:
                continue
            where = "runs up to" if RANK[used.name] > RANK[layer.name] else "reaches across to"
            problems.append(f"{module}:{line} ({layer.name}) imports {name}: {where} layer {used.name}")
    return problems


def import_cycles(graph: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """The strongly connected groups of more than one file (Tarjan), each sorted: a lazy
    import inside a function ties a ring as surely as one at the top."""
    edges = {m: sorted({n for _, n in found if n in graph and n != m}) for m, found in graph.items()}
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(groups)


def test_every_module_has_a_layer():
    for path in MODULES:
        layer_of(module_name(path))


def test_layers_use_only_lower_layers():
    for layer in LAYERS:
        for used in layer.uses:
            assert RANK[used] < RANK[layer.name], (layer.name, used)


def test_the_reader_sees_every_kind_of_import():
    # a module of spillway.launch with relative, absolute and in-function imports
    source = ("from . import plugins\nfrom ..workflows import params\nimport spillway.launch.commands\n"
              "def f():\n    from .spec import WorkerSpec\n    from spillway import workflows\n"
              "import numpy\nfrom ..memory import store as s, not_a_module\n")
    found = imports_in(source, "spillway.launch")
    assert found == [(1, "spillway.launch.plugins"), (2, "spillway.workflows.params"),
                     (3, "spillway.launch.commands"), (5, "spillway.launch.spec"),
                     (6, "spillway.workflows"), (8, "spillway.memory"),
                     (8, "spillway.memory.store")]
    assert layer_of("spillway.run.compute").name == "run"
    assert layer_of("spillway.options.settings").name == "options"
    assert layer_of("spillway.upstream").name == "seam"
    assert layer_of("spillway.datapath.plane.wire").name == "datapath"
    assert layer_of("spillway.clusters.local").name == "clusters"
    assert layer_of("spillway.service.jobdb.tokens").name == "service"
    assert layer_of("spillway").name == "api"
    assert layer_of("spillway.__main__").name == "cli"
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("spillway.elsewhere")
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("spillway.upstreams")


def test_no_module_imports_upward():
    problems = upward_imports(import_graph())
    assert not problems, "\n".join(problems)


def test_no_import_cycle_between_files():
    cycles = import_cycles(import_graph())
    assert not cycles, "\n".join(" <-> ".join(group) for group in cycles)


def test_the_checks_fail_on_a_planted_upward_import_and_a_planted_cycle():
    graph = import_graph()
    planted = dict(graph)
    # the job database reaching up to the HTTP app, the options object to the worker plugins
    # (a sideways import inside the cluster, which closes a ring: plugins import options)
    planted["spillway.service.jobdb.models"] = graph["spillway.service.jobdb.models"] + [(1, "spillway.service.api.app")]
    planted["spillway.options.settings"] = graph["spillway.options.settings"] + [(1, "spillway.launch.plugins")]
    planted["spillway.workflows.params"] = graph["spillway.workflows.params"] + [(1, "spillway.run.compute")]
    problems = upward_imports(planted)
    assert [p for p in problems if p.startswith("spillway.workflows.params:1 ")] == [
        "spillway.workflows.params:1 (workflows) imports spillway.run.compute: runs up to layer run"]
    cycles = import_cycles(planted)
    assert any({"spillway.options.settings", "spillway.launch.plugins"} <= set(group) for group in cycles)
    assert upward_imports(graph) == [] and import_cycles(graph) == []


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_each_layer_says_why(layer):
    assert layer.why and layer.package


#: the launch package: every layer above it (the CLI, the bench, the notebook clusters,
#: runs, the service, workflows) goes through its public names only
LAUNCH = "spillway.launch"


def launch_public_names() -> set[str]:
    """``__all__`` of the launch package, read from its source."""
    tree = ast.parse((PACKAGE / "launch" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{LAUNCH} declares no __all__")


#: the launch room's modules that the rooms above use by name, beside ``__all__``: what
#: every cluster registers (the worker plugin and its ``on_teardown`` and snapshots, the
#: collector settler, the worker-loss watch), and the launchers an entry point names beside
#: ``open_cluster`` (``spillway mpi``, ``spillway slurm``, ``spillway.slurm()``)
PUBLIC_MODULES = {"plugins", "collector", "worker_loss", "mpi", "slurm_batch", "slurm_jobs"}


def private_launch_imports(source: str, package: str, public: set[str]) -> list[tuple[int, str]]:
    """(line, name) for each import in ``source`` (a module of ``package``) of the launch
    package's insides: one of its submodules but :data:`PUBLIC_MODULES`, or a name of it
    outside ``public`` (and those modules)."""
    found = set()
    open_modules = {f"{LAUNCH}.{m}" for m in PUBLIC_MODULES}

    def inside(name: str) -> bool:
        return name.startswith(LAUNCH + ".") and not any(name == m or name.startswith(m + ".") for m in open_modules)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, a.name) for a in node.names if inside(a.name)}
        elif isinstance(node, ast.ImportFrom):
            target = from_target(node, package)
            if inside(target):
                found.add((node.lineno, target))
            elif target == LAUNCH:
                # a public name may share its submodule's name (worker_config): the package's
                # attribute is the name it re-exports
                found |= {(node.lineno, f"{LAUNCH}.{a.name}") for a in node.names
                          if a.name not in public and a.name not in PUBLIC_MODULES}
    return sorted(found)


def test_the_launch_check_sees_private_imports():
    source = ("from spillway.launch import open_cluster, WorkerSpec\n"
              "from spillway.launch.spec import off_node_spec\n"
              "def f():\n    from ...launch import gpu_worker, _arrived\n"
              "import spillway.launch.render\n")
    found = private_launch_imports(source, "spillway.service.jobs", {"open_cluster", "WorkerSpec"})
    assert found == [(2, "spillway.launch.spec"), (4, "spillway.launch._arrived"),
                     (4, "spillway.launch.gpu_worker"), (5, "spillway.launch.render")]


def test_layers_above_the_cluster_use_only_the_launch_packages_public_names():
    public = launch_public_names()
    problems = []
    for path in MODULES:
        module = module_name(path)
        if layer_of(module).name == "launch":
            continue
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for line, name in private_launch_imports(path.read_text(), package, public):
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}, which is not among {LAUNCH}.__all__")
    assert not problems, "\n".join(problems)


def test_the_launch_packages_public_names_exist():
    import importlib

    launch = importlib.import_module(LAUNCH)
    assert set(launch.__all__) == launch_public_names()
    assert [n for n in launch.__all__ if not hasattr(launch, n)] == []


#: every launcher: a module directly in the launch package and the backend it defines
#: (:class:`spillway.launch.backend.Backend`: ``start(options, launch, specs)``). A new
#: launcher is a module beside these, named here.
LAUNCHERS = {
    "local_gpu": "LocalGPU",          # dask-cuda's LocalCUDACluster (open_cluster, plan kind gpu)
    "local_cpu": "LocalCPU",          # distributed's LocalCluster (plan kind cpu)
    "attach": "Attach",               # a running scheduler (plan kind attach)
    "gpu_worker": "NodeWorkers",      # this node's GPU workers: `spillway worker`
    "mpi": "MPIRank",                 # a rank of dask-mpi: `spillway mpi`
    "slurm_batch": "SlurmBatch",      # a Slurm batch job of workflows: `spillway slurm`
    "slurm_jobs": "SlurmJobs",        # dask-jobqueue's cluster of Slurm jobs: `spillway.slurm()`
}
#: what starts workers or submits their jobs, imported by the launch package alone (and by
#: the seam, which checks their shape): the cluster managers' libraries, whole or by name
LAUNCHING_MODULES = ("dask_jobqueue", "dask_mpi", "mpi4py")
LAUNCHING_NAMES = {"dask_cuda": {"LocalCUDACluster", "CUDAWorker"}, "distributed": {"LocalCluster"},
                   "distributed.deploy.local": {"LocalCluster"}}
#: a batch system's base: each system beside it is a launcher too
BATCH_BASE = "BatchSystem"


def backend_classes(source: str) -> list[str]:
    """The classes of ``source`` that are backends (a ``start`` method taking ``options``,
    ``launch`` and ``specs``) or batch systems (a subclass of :data:`BATCH_BASE`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        starts = [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == "start"]
        if any([a.arg for a in f.args.args][:4] == ["self", "options", "launch", "specs"] for f in starts):
            found.append(node.name)
        elif any(getattr(b, "id", getattr(b, "attr", None)) == BATCH_BASE for b in node.bases):
            found.append(node.name)
    return found


def launching_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) for each import in ``source`` of what starts workers
    (:data:`LAUNCHING_MODULES`, :data:`LAUNCHING_NAMES`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in LAUNCHING_MODULES]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in LAUNCHING_MODULES:
                found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if a.name in LAUNCHING_NAMES.get(node.module, ())]
    return sorted(found)


def test_the_launcher_checks_see_backends_and_launching_imports():
    source = ("from dask_jobqueue.slurm import SLURMCluster\nimport mpi4py.MPI\nfrom distributed import Client, "
              "LocalCluster\nclass Mine:\n    def start(self, options, launch, specs):\n        pass\n"
              "class Job:\n    async def start(self):\n        pass\nclass PBS(batch.BatchSystem):\n    pass\n")
    assert backend_classes(source) == ["Mine", "PBS"]
    assert launching_imports(source) == [(1, "dask_jobqueue.slurm"), (2, "mpi4py.MPI"),
                                         (3, "distributed.LocalCluster")]


def test_the_launchers_are_modules_of_one_package():
    """Each launcher is one module of the launch package with its backend, and no module
    elsewhere defines a backend or a batch system: where a new launcher goes is the launch
    package, beside the others."""
    found = {}
    for path in MODULES:
        for name in backend_classes(path.read_text()):
            found.setdefault(name, []).append(module_name(path))
    expected = {backend: [f"{LAUNCH}.{module}"] for module, backend in LAUNCHERS.items()}
    # the protocol itself, and the batch launcher's system beside its backend
    expected |= {"Backend": [f"{LAUNCH}.backend"], "Slurm": [f"{LAUNCH}.slurm_batch"]}
    assert found == expected
    for module in LAUNCHERS:
        assert (PACKAGE / "launch" / f"{module}.py").is_file(), module


def test_only_the_launch_package_starts_workers():
    """The cluster managers (dask-cuda's, distributed's local one, dask-jobqueue, dask-mpi,
    mpi4py) are imported by the launch package alone: the CLI's commands and the notebook's
    clusters call a launcher (the seam only checks their shape)."""
    problems = []
    for path in MODULES:
        module = module_name(path)
        if layer_of(module).name in ("launch", "seam"):
            continue
        problems += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
                     for line, name in launching_imports(path.read_text())]
    assert not problems, "\n".join(problems)


def test_the_backend_registry_names_the_plan_kinds_launchers():
    from spillway.launch.backend import BACKENDS

    assert {kind: type(backend).__module__ for kind, backend in BACKENDS.items()} == {
        "gpu": f"{LAUNCH}.local_gpu", "cpu": f"{LAUNCH}.local_cpu", "attach": f"{LAUNCH}.attach"}


#: a module named in a caption: ``:mod:`X```, and the other roles (``:class:`X``` ...), whose
#: name is a module or a name defined in one; ``~`` and leading dots read as in Sphinx and
#: in imports (``.x`` is the package's own x)
CAPTION_REF = __import__("re").compile(r":(mod|func|class|data|meth|attr|exc|obj):`~?([\w.]+)`")


def _top_names(module: str) -> set[str] | None:
    """The names a module of spillway binds at its top, read from its source; None where
    there is no such module."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    file = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
    if not file.is_file():
        return None
    names = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def caption_problems(doc: str, package: str) -> list[str]:
    """The references of a package's caption to modules (or names in them) that do not exist."""
    problems = []
    for role, ref in CAPTION_REF.findall(doc):
        dots = len(ref) - len(ref.lstrip("."))
        name = from_target(ast.ImportFrom(module=ref.lstrip(".") or None, level=dots), package) if dots else ref
        if not name.startswith("spillway"):
            continue  # another library's name
        if _is_module(name):
            continue
        module, _, attr = name.rpartition(".")
        # a method or attribute of a class: the class must exist
        while module and not _is_module(module):
            module, _, attr = module.rpartition(".")
        if role == "mod" or not module or attr not in (_top_names(module) or set()):
            problems.append(f":{role}:`{ref}` ({name})")
    return problems


PACKAGES = sorted(p for p in MODULES if p.name == "__init__.py")


@pytest.mark.parametrize("init", PACKAGES, ids=lambda p: module_name(p))
def test_every_caption_names_what_exists(init):
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc, f"{module_name(init)} has no caption (its __init__.py docstring)"
    problems = caption_problems(doc, module_name(init))
    assert not problems, f"{init.relative_to(PACKAGE.parent)} names what does not exist: " + ", ".join(problems)


def test_the_caption_check_fails_on_a_name_that_does_not_exist():
    doc = ("The store: :mod:`.store`, :class:`~.store.TieredStore`, :mod:`.buffers` (gone), "
           ":func:`spillway.launch.open_cluster`, :func:`spillway.launch.no_such_thing` and "
           ":class:`numpy.ndarray`.")
    assert caption_problems(doc, "spillway.memory") == [
        ":mod:`.buffers` (spillway.memory.buffers)",
        ":func:`spillway.launch.no_such_thing` (spillway.launch.no_such_thing)"]


BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_bench_imports_the_product_never_its_cli():
    # the CLI's bench command imports the bench: a bench that imported the CLI back would
    # make the two one room. What both need of a machine's description sits below both
    # (spillway.options.gpus, spillway.options.stack)
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        package = ".".join(path.relative_to(BENCH).with_suffix("").parts[:-1])
        for line, name in imports_in(path.read_text(), package, str(path)):
            if name == "spillway.cli" or name.startswith("spillway.cli."):
                found.append(f"{path.relative_to(BENCH.parent)}:{line} imports {name}")
    assert found == []
