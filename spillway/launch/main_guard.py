"""A script that starts a cluster at its top level, refused before anything starts.

distributed starts its worker processes with ``spawn``, which runs the main script again in
each of them (as ``__mp_main__``): a cluster started outside ``if __name__ == "__main__":``
is started again in every worker, whose start then fails. The call's place in the script
says whether that will happen, so it is read from the script's source (the line of its
top-level code that the call came from, and the ``if __name__ == "__main__":`` blocks
around it) before any process starts. Notebooks, ``python -c`` and the REPL have no
script to run again.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from spillway.options.errors import MainGuardMissing

HINT = ('start the cluster under `if __name__ == "__main__":` (worker processes import the script '
        "again; see the README, From a script)")


def importing_in_worker_process() -> bool:
    """True while a worker process being started imports the user's script again: the
    ``spawn`` start method runs the main module, as ``__mp_main__``, while it is still
    inheriting its parent's state (only then: a started worker's main module keeps that
    name for its whole life)."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def check_main_guard(what: str = "the cluster") -> None:
    """Raise :class:`MainGuardMissing` where this call comes from the main script's top
    level outside an ``if __name__ == "__main__":`` block, and worker processes are
    spawned (distributed's default); in such a worker process itself, end it quietly (the
    parent says why, in one line)."""
    import dask.config

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") != "spawn":
        return
    if importing_in_worker_process():
        raise SystemExit(2)
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or hasattr(sys, "ps1") or not _run_again_by_spawn(main):
        return
    line = _top_level_line(vars(main))
    if line is None:
        return
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return  # a script that cannot be read is not second-guessed
    if not _guarded(tree, line):
        raise MainGuardMissing(f"{Path(path).name}, line {line}: {what} is started at the script's top level; {HINT}")


def _run_again_by_spawn(main) -> bool:
    """Whether ``spawn`` runs the main module again in each new process, as
    multiprocessing decides it (``spawn._fixup_main_from_name``): a script always, a module
    run with ``-m`` unless it is a package's ``__main__`` (``python -m spillway``)."""
    name = getattr(getattr(main, "__spec__", None), "name", None)
    return name is None or not (name == "__main__" or name.endswith(".__main__"))


def _top_level_line(main_globals: dict) -> int | None:
    """The line of the main script's top-level code that this call came from (None where
    the call does not come from it: a thread, a callback)."""
    frame = sys._getframe(1)
    found = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main_globals:
            found = frame.f_lineno
        frame = frame.f_back
    return found


def _guarded(tree: ast.Module, line: int) -> bool:
    """Whether ``line`` lies in the body of an ``if __name__ == "__main__":`` at the top
    level of ``tree`` (or of a block nested in one)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _tests_main(node.test):
            first, last = node.body[0].lineno, max(getattr(n, "end_lineno", n.lineno) for n in node.body)
            if first <= line <= last:
                return True
    return False


def _tests_main(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1
