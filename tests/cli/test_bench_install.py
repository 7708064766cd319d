"""The benchmarks are a distribution of their own (benchmarks/pyproject.toml): where they
are not installed, ``spillway bench`` says how to install them in one line, before
anything starts."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from spillway.cli import main


@pytest.mark.parametrize("args", [["bench", "--cpu", "--sizes", "tiny", "--only", "W1"]], ids=["bench"])
def test_a_bench_command_without_the_benchmarks_says_how_to_install_them(monkeypatch, no_cluster, args):
    # a module set to None in sys.modules fails its import as a missing one does
    for name in [m for m in sys.modules if m == "spillway_bench" or m.startswith("spillway_bench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "spillway_bench", None)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["spillway: error: this command needs the benchmarks (spillway_bench), which are not "
                     "installed: pip install -e ./benchmarks (from a spillway checkout)"]
