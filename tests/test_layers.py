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
    #: module name prefixes (a prefix names the module and everything under it)
    modules: tuple[str, ...]
    #: the lower layers this one may import from (its own always)
    uses: tuple[str, ...]
    why: str


#: Lowest first. A module belongs to the layer with the longest prefix that names it; the
#: top package's own name matches only ``spillway/__init__.py``, so a new module outside
#: every layer fails :func:`test_every_module_has_a_layer` instead of landing in "api".
#: The bench sits beside the CLI (listed just below it so that the CLI's bench commands
#: import downward); no other layer names it in ``uses``.
LAYERS = (
    Layer("core", ("spillway.service",), (),
          "The cluster itself: options and their config, sizes, errors, GPU discovery, the "
          "launchers and worker specs, worker and scheduler plugins, the tiered memory "
          "store, transfers, progress counting, worker loss, host info, and what notebooks "
          "draw of any of it (bars, HTML tables, figures). It knows no workflow: a worker "
          "runs whatever graph it is given, and a workflow's resources register their own "
          "clean-up with the worker plugin (plugins.on_teardown)."),
    Layer("workflows", ("spillway.workflows",), ("core",),
          "Named chunked-array workflows and their Zarr I/O: graphs built from parameters "
          "and a target, raising the core's errors and sizing with its sizes; they run on "
          "any cluster and import nothing that runs them."),
    Layer("run", ("spillway.service.run", "spillway.service.local", "spillway.service.preflight"),
          ("core", "workflows"),
          "Running a workflow on a cluster: the target read from the workers, compute, "
          "output, verification, the run report and its text, HTML and figure, the "
          "embedded cluster of notebooks (spillway.local) and the admission check before a "
          "GPU cluster starts (it builds the workflow's graph)."),
    Layer("service", ("spillway.service.api", "spillway.service.jobs", "spillway.service.jobdb",
                      "spillway.service.client"),
          ("core", "workflows", "run"),
          "The shared service: the HTTP API, the job scheduler and its database, which run "
          "workflows on one cluster for many tenants, and the Python client of that API."),
    Layer("api", ("spillway",), ("core", "workflows", "run", "service"),
          "The public names (spillway.local, spillway.connect, spillway.Options and the "
          "errors): `import spillway` re-exports what users type, the HTTP client lazily."),
    Layer("deploy", ("spillway.deploy",), ("core",),
          "Slurm, MPI and systemd files and command lines rendered from the core's worker "
          "specs and options by plain functions; what they start runs the CLI, so they "
          "import nothing of workflows, runs or the service."),
    Layer("bench", ("spillway.bench",), ("core", "workflows", "run", "service", "api", "deploy"),
          "Benchmarks beside the CLI: they drive every layer below and are imported by "
          "nothing but the CLI's bench commands, so no product code depends on them."),
    Layer("cli", ("spillway.service.cli", "spillway.__main__"),
          ("core", "workflows", "run", "service", "api", "deploy", "bench"),
          "The command line at the top: it starts everything below (serve, worker, run, "
          "slurm, bench)."),
)
RANK = {layer.name: i for i, layer in enumerate(LAYERS)}
BY_NAME = {layer.name: layer for layer in LAYERS}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> Layer:
    best, length = None, -1
    for layer in LAYERS:
        for prefix in layer.modules:
            inside = module == prefix or (prefix != "spillway" and module.startswith(prefix + "."))
            if inside and len(prefix) > length:
                best, length = layer, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


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


def test_every_module_has_a_layer():
    for path in MODULES:
        layer_of(module_name(path))


def test_layers_use_only_lower_layers():
    for layer in LAYERS:
        for used in layer.uses:
            assert RANK[used] < RANK[layer.name], (layer.name, used)


def test_the_reader_sees_every_kind_of_import():
    # a module of spillway.service with relative, absolute and in-function imports
    source = ("from . import options\nfrom ..workflows import params\nimport spillway.deploy.commands\n"
              "def f():\n    from .launch.spec import WorkerSpec\n    from spillway import workflows\n"
              "import numpy\nfrom .memory import store as s, not_a_module\n")
    found = imports_in(source, "spillway.service")
    assert found == [(1, "spillway.service.options"), (2, "spillway.workflows.params"),
                     (3, "spillway.deploy.commands"), (5, "spillway.service.launch.spec"),
                     (6, "spillway.workflows"), (8, "spillway.service.memory"),
                     (8, "spillway.service.memory.store")]
    assert layer_of("spillway.service.run.compute").name == "run"
    assert layer_of("spillway.service.options").name == "core"
    assert layer_of("spillway").name == "api"
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("spillway.elsewhere")


def test_no_module_imports_upward():
    problems = []
    for path in MODULES:
        module = module_name(path)
        layer = layer_of(module)
        for line, name in imports(path):
            used = layer_of(name)
            if used.name == layer.name or used.name in layer.uses:
                continue
            where = "runs up to" if RANK[used.name] > RANK[layer.name] else "reaches across to"
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({layer.name}) imports {name}: "
                            f"{where} layer {used.name}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_each_layer_says_why(layer):
    assert layer.why and layer.modules


#: the launch package: every layer above the core (deploy rendering the core's specs, the
#: CLI, the bench, runs, the service, workflows) goes through its public names only
LAUNCH = "spillway.service.launch"


def launch_public_names() -> set[str]:
    """``__all__`` of the launch package, read from its source."""
    tree = ast.parse((PACKAGE / "service" / "launch" / "__init__.py").read_text())
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
    source = ("from spillway.service.launch import open_cluster, WorkerSpec\n"
              "from spillway.service.launch.spec import off_node_spec\n"
              "def f():\n    from ...service.launch import gpu_worker, _arrived\n"
              "import spillway.service.launch.render\n")
    found = private_launch_imports(source, "spillway.deploy.mpi", {"open_cluster", "WorkerSpec"})
    assert found == [(2, "spillway.service.launch.spec"), (4, "spillway.service.launch._arrived"),
                     (4, "spillway.service.launch.gpu_worker"), (5, "spillway.service.launch.render")]


def test_layers_above_the_core_use_only_the_launch_packages_public_names():
    public = launch_public_names()
    problems = []
    for path in MODULES:
        module = module_name(path)
        if layer_of(module).name == "core":
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
