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


#: Lowest first, one package each. The top package holds two modules of its own, named in
#: TOP; any other module outside these packages fails :func:`test_every_module_has_a_layer`.
#: The bench sits beside the CLI (listed just below it so that the CLI's bench commands
#: import downward); no other layer names it in ``uses``.
LAYERS = (
    Layer("cluster", "spillway.cluster", (),
          "The cluster itself: options and their config, sizes, errors, GPU discovery, the "
          "launch plan, worker specs and launchers, worker and scheduler plugins, the tiered "
          "memory store, transfers between workers, worker loss and host info. It knows no "
          "workflow: a worker runs whatever graph it is given, and a workflow's resources "
          "register their own clean-up with the worker plugin (plugins.on_teardown)."),
    Layer("deploy", "spillway.deploy", ("cluster",),
          "Slurm, MPI and systemd files and command lines rendered from the cluster's worker "
          "specs and options by plain functions, and a cluster of Slurm jobs (dask-jobqueue's "
          "cluster manager with spillway's job script); what they start runs the CLI, so they "
          "import nothing of workflows, runs or the service. Right above the cluster, because "
          "it uses the cluster alone and spillway.slurm() in runs drives its cluster of jobs."),
    Layer("workflows", "spillway.workflows", ("cluster",),
          "Named chunked-array workflows and their Zarr I/O: graphs built from parameters "
          "and a target, raising the cluster's errors and sizing with its sizes; they run on "
          "any cluster and import nothing that runs them."),
    Layer("run", "spillway.run", ("cluster", "deploy", "workflows"),
          "Running a workflow or a user's collection on a cluster: the target read from the "
          "workers, compute, output, verification, progress, the run report and its text, "
          "HTML and figure, the clusters of notebooks (spillway.local, and spillway.slurm on "
          "deploy's cluster of Slurm jobs) and the admission check before a GPU cluster starts "
          "(it builds the workflow's graph)."),
    Layer("service", "spillway.service", ("cluster", "workflows", "run"),
          "The shared service: the HTTP API, the job scheduler and its database, which run "
          "workflows on one cluster for many tenants, and the Python client of that API."),
    Layer("api", "spillway", ("cluster", "workflows", "run", "service"),
          "The public names (spillway.local, spillway.connect, spillway.Options and the "
          "errors): `import spillway` re-exports what users type, the HTTP client lazily."),
    Layer("bench", "spillway.bench", ("cluster", "workflows", "run", "service", "api", "deploy"),
          "Benchmarks beside the CLI: they drive every layer below and are imported by "
          "nothing but the CLI's bench commands, so no product code depends on them."),
    Layer("cli", "spillway.cli", ("cluster", "workflows", "run", "service", "api", "deploy", "bench"),
          "The command line at the top: it starts everything below (serve, worker, run, "
          "slurm, bench)."),
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
    # a module of spillway.cluster with relative, absolute and in-function imports
    source = ("from . import options\nfrom ..workflows import params\nimport spillway.deploy.commands\n"
              "def f():\n    from .launch.spec import WorkerSpec\n    from spillway import workflows\n"
              "import numpy\nfrom .memory import store as s, not_a_module\n")
    found = imports_in(source, "spillway.cluster")
    assert found == [(1, "spillway.cluster.options"), (2, "spillway.workflows.params"),
                     (3, "spillway.deploy.commands"), (5, "spillway.cluster.launch.spec"),
                     (6, "spillway.workflows"), (8, "spillway.cluster.memory"),
                     (8, "spillway.cluster.memory.store")]
    assert layer_of("spillway.run.compute").name == "run"
    assert layer_of("spillway.cluster.options").name == "cluster"
    assert layer_of("spillway.service.jobdb.tokens").name == "service"
    assert layer_of("spillway").name == "api"
    assert layer_of("spillway.__main__").name == "cli"
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("spillway.elsewhere")
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("spillway.utils")


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
    planted["spillway.cluster.options"] = graph["spillway.cluster.options"] + [(1, "spillway.cluster.plugins")]
    planted["spillway.workflows.params"] = graph["spillway.workflows.params"] + [(1, "spillway.run.compute")]
    problems = upward_imports(planted)
    assert [p for p in problems if p.startswith("spillway.workflows.params:1 ")] == [
        "spillway.workflows.params:1 (workflows) imports spillway.run.compute: runs up to layer run"]
    cycles = import_cycles(planted)
    assert any({"spillway.cluster.options", "spillway.cluster.plugins"} <= set(group) for group in cycles)
    assert upward_imports(graph) == [] and import_cycles(graph) == []


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_each_layer_says_why(layer):
    assert layer.why and layer.package


#: the launch package: every layer above the cluster (deploy rendering its specs, the
#: CLI, the bench, runs, the service, workflows) goes through its public names only
LAUNCH = "spillway.cluster.launch"


def launch_public_names() -> set[str]:
    """``__all__`` of the launch package, read from its source."""
    tree = ast.parse((PACKAGE / "cluster" / "launch" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{LAUNCH} declares no __all__")


def private_launch_imports(source: str, package: str, public: set[str]) -> list[tuple[int, str]]:
    """(line, name) for each import in ``source`` (a module of ``package``) of the launch
    package's insides: one of its submodules, or a name of it outside ``public``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, a.name) for a in node.names if a.name.startswith(LAUNCH + ".")}
        elif isinstance(node, ast.ImportFrom):
            target = from_target(node, package)
            if target.startswith(LAUNCH + "."):
                found.add((node.lineno, target))
            elif target == LAUNCH:
                # a public name may share its submodule's name (worker_config): the package's
                # attribute is the name it re-exports
                found |= {(node.lineno, f"{LAUNCH}.{a.name}") for a in node.names if a.name not in public}
    return sorted(found)


def test_the_launch_check_sees_private_imports():
    source = ("from spillway.cluster.launch import open_cluster, WorkerSpec\n"
              "from spillway.cluster.launch.spec import off_node_spec\n"
              "def f():\n    from ...cluster.launch import gpu_worker, _arrived\n"
              "import spillway.cluster.launch.render\n")
    found = private_launch_imports(source, "spillway.deploy.mpi", {"open_cluster", "WorkerSpec"})
    assert found == [(2, "spillway.cluster.launch.spec"), (4, "spillway.cluster.launch._arrived"),
                     (4, "spillway.cluster.launch.gpu_worker"), (5, "spillway.cluster.launch.render")]


def test_layers_above_the_cluster_use_only_the_launch_packages_public_names():
    public = launch_public_names()
    problems = []
    for path in MODULES:
        module = module_name(path)
        if layer_of(module).name == "cluster":
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
