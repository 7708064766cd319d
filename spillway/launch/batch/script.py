"""The pieces of a batch script that no batch system changes: the template, shell
quoting, the worker command chosen from the options, and the workflow steps.

:meth:`spillway.launch.batch.BatchSystem.job_script` puts them together with the
system's own directives and step launchers. Everything here is a pure function of its
arguments, so the same inputs always give the same script and the tests check it as text.
"""

from __future__ import annotations

import json
import shlex
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

from spillway.options.settings import Options

from .. import commands
from ..spec import off_node_spec
from .layout import Layout
from .run import Run

TEMPLATE_FILE = Path(__file__).with_name("job.sh.tmpl")

#: stands for the job's scheduler file, a shell variable that must not be quoted away
SCHEDULER_FILE = "\0SCHEDULER_FILE"


class ScriptTemplate(string.Template):
    # only @{name} is a placeholder, so bash's own $ and @ pass through untouched
    pattern = r"@\{(?P<braced>[a-z_]+)\}|(?P<escaped>@@\{)|(?P<named>(?!))|(?P<invalid>(?!))"


def fill(text: str, values: Mapping[str, object]) -> str | None:
    """``text`` with its ``{name}`` fields filled from ``values``; None where a field is
    unset (None or empty), so the directive or word that names it is left out."""
    names = [name for _, name, _, _ in string.Formatter().parse(text) if name]
    if any(values[name] in (None, "") for name in names):
        return None
    return text.format(**values)


def fill_words(line: str, values: Mapping[str, object]) -> str:
    """``line`` filled word by word, each word naming an unset value left out."""
    return " ".join(word for word in (fill(w, values) for w in line.split(" ")) if word is not None)


def shell(args: Sequence[str]) -> str:
    return " ".join('"$SCHEDULER_FILE"' if a == SCHEDULER_FILE else shlex.quote(str(a)) for a in args)


def shell_lines(args: Sequence[str], indent: str = "    ", width: int = 100) -> str:
    """``shell(args)`` continued over lines of about ``width`` characters, a flag and its
    value kept together."""
    words, i = [], 0
    while i < len(args):
        take = 2 if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--") else 1
        words.append(shell(args[i:i + take]))
        i += take
    lines, line = [], ""
    for word in words:
        if line and len(indent) + len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return f" \\\n{indent}".join(lines)


def workers(options: Options, job_layout: Layout) -> tuple[str, list[str], str, dict[str, str]]:
    """The module each node's worker task runs (``python -m MODULE``), its arguments, the
    script's words for the workers, and the environment they need."""
    # the workers' settings as far as they are known here: the nodes' GPUs and memory are not
    spec = (off_node_spec(options, protocol=job_layout.protocol, workers=job_layout.workers_per_node)
            if job_layout.kind == "gpu" else None)
    if spec is not None and (spec.tiered or spec.workers_per_gpu > 1):
        # dask-cuda's command has no flag for another store, nor for several workers on a
        # GPU: spillway's own runs its CUDAWorker, and resolves the workers' spec from
        # these options on the node
        args = commands.spillway_worker_args(options, scheduler_file=SCHEDULER_FILE, protocol=job_layout.protocol)
        store = "tiered-store" if spec.tiered else "dask-cuda"
        text = (f"one {store} worker per GPU" if spec.workers_per_gpu == 1
                else f"{spec.workers_per_gpu} {store} workers per GPU")
        environment = commands.ucx_environment(options) if job_layout.protocol == "ucx" else {}
        return "spillway", args, text, environment
    if spec is not None:
        args = commands.gpu_worker_args(spec, scheduler_file=SCHEDULER_FILE)
        environment = commands.ucx_environment(options) if job_layout.protocol == "ucx" else {}
        return "dask cuda worker", args, "one dask-cuda worker per GPU", environment
    args = commands.cpu_worker_args(options, scheduler_file=SCHEDULER_FILE, protocol=job_layout.protocol,
                                    n_workers=job_layout.workers_per_node)
    return "dask worker", args, f"{job_layout.workers_per_node} CPU worker(s) with NumPy chunks", {}


def run_lines(runs: Sequence[Run], client: list[str]) -> list[str]:
    lines = []
    width = max(2, len(str(len(runs))))
    for i, run in enumerate(runs, 1):
        stem = f"{i:0{width}d}-{run.workflow}"
        args = ["run", run.workflow, "--params-json", json.dumps(dict(run.params), sort_keys=True),
                *(["--verify"] if run.verify else []), "--json", "--no-progress", *client]
        lines += [
            f"# {i}/{len(runs)}: {run.workflow}; the report is one JSON object",
            f'"$PYTHON" -m spillway {shell(args)} \\',
            f'  >"$RESULTS/{stem}.json" 2>"$RESULTS/{stem}.log" &',
            f'wait $! || {{ status=1; echo "spillway: {stem} failed; see $RESULTS/{stem}.log" >&2; }}',
        ]
    return lines


def render(values: Mapping[str, str]) -> str:
    """The template filled with ``values``, one for each of its placeholders."""
    text = ScriptTemplate(TEMPLATE_FILE.read_text()).substitute(values)
    # empty placeholders (no setup, no environment, no note) would leave blank runs of lines
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text
