"""A request the cluster cannot hold is refused for that, in bytes (its projected footprint
and the cluster's device + host + disk capacity), before any other check of its parameters:
not with the chunk count of a size nobody could run."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from spillway import workflows
from spillway.cli import main
from spillway.options.errors import AdmissionError, ParamError
from spillway.memory.admission import Capacity, admit
from spillway.workflows.params import Target

GB = 10**9
CAPACITY = Capacity(device_bytes=0, host_bytes=16 * GB, disk_bytes=400 * GB, n_workers=2)
CPU = Target(kind="cpu", n_workers=2)


def _fits(name):
    return lambda floor: admit(name, floor, CAPACITY)


def _assert_speaks_in_bytes(message: str):
    assert "\n" not in message
    assert re.search(r"projected footprint [\d.]+ [TP]iB exceeds", message), message
    assert "device + host + disk capacity 387.43 GiB (device 0 B + host tier 14.90 GiB + disk 372.53 GiB, 2 workers)" in message, message
    # the workflow's own name aside (rechunk), nothing about chunks
    assert "chunk" not in message.split(": ", 1)[1], message


@pytest.mark.parametrize("raw", [
    {"size": "1PB"},
    # whatever else is wrong with it, the size is what it is refused for
    {"size": "1PB", "chunks": "10x10"},
    {"size": "1PB", "seed": "abc"},
    {"size": "1PB", "sise": 3},
    {"size": "1PB", "chunks": "3x5"},
])
def test_a_size_past_the_cluster_is_refused_in_bytes_first(raw):
    with pytest.raises(AdmissionError) as e:
        workflows.get("transpose-sum").build_run(raw, CPU, fits=_fits("transpose-sum"))
    _assert_speaks_in_bytes(str(e.value))
    assert str(e.value).startswith("transpose-sum: projected footprint 909.49 TiB")


@pytest.mark.parametrize("name,raw", [
    ("reduction", {"size": "1PB"}),
    ("rechunk", {"size": "1PB"}),
    ("stencil", {"size": "1PB", "ndim": 3}),
    ("tsqr", {"size": "1PB", "columns": 64}),
    ("matmul", {"size": "300000000x1000000"}),
])
def test_every_generated_input_is_refused_in_bytes(name, raw):
    with pytest.raises(AdmissionError) as e:
        workflows.get(name).validate(raw, CPU, fits=_fits(name))
    _assert_speaks_in_bytes(str(e.value))


def test_what_fits_still_gets_its_chunk_count_checked():
    # 4 million chunks of a 32 MB array: the cluster holds it, the graph would not fit the client
    with pytest.raises(ParamError, match="chunks: 1x1 makes 4000000 chunks of the 2000x2000 array"):
        workflows.get("transpose-sum").validate({"size": "2000x2000", "chunks": "1x1"}, CPU,
                                                fits=_fits("transpose-sum"))


def test_without_a_cluster_the_chunk_refusal_names_the_bytes_too():
    # a Slurm job is checked before any cluster exists: the chunk limit speaks, with the size
    with pytest.raises(ParamError) as e:
        workflows.get("transpose-sum").validate({"size": "1PB"}, CPU)
    assert "of the 11180339x11180339 array (909.49 TiB), more than the limit of 2000000" in str(e.value)


def test_the_footprint_of_the_parameters_is_a_floor_under_the_built_plans():
    # refusing on it never refuses a run that the built run's footprint would admit
    for name in workflows.names():
        workflow = workflows.get(name)
        for raw in ({}, {"dtype": "float32"}):
            params, built = workflow.build_run(raw, CPU)
            floor = workflow.data_footprint(params, CPU)
            assert floor is not None, name
            assert 0 < floor.total_bytes <= built.footprint.total_bytes, (name, raw)
            assert floor.total_bytes == built.footprint.input_bytes or name == "matmul", name


def test_a_workflow_without_size_parameters_projects_nothing():
    from spillway.workflows.params import Param
    from spillway.workflows.workflow import Workflow

    plain = Workflow(name="plain", description="", params=(Param("n", "int", "n", default=3),),
                     build=lambda params, target: None)
    assert plain.data_footprint(plain.validate({"n": 4}), CPU) is None
    seen = []
    plain.validate({"n": 4}, CPU, fits=seen.append)
    assert seen == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cli_refuses_a_petabyte_in_bytes(tmp_path):
    result = CliRunner().invoke(
        main,
        ["run", "transpose-sum", "--param", "size=1PB", "--cpu", "--n-workers", "1", "--memory-limit", "1GB",
         "--dashboard-address", "", "--local-directory", str(tmp_path)],
    )
    assert result.exit_code == AdmissionError.exit_code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    last = lines[-1]
    assert last.startswith("spillway: error: transpose-sum: projected footprint 909.49 TiB exceeds the cluster's "
                           "device + host + disk capacity "), result.output
    assert re.search(r"capacity [\d.]+ \w+ \(device 0 B \+ host tier 0.93 GiB \+ disk [\d.]+ \w+ \([\d.]+ \w+ free less a reserve of [\d.]+ \w+\), 1 worker\)$", last), last
    assert "chunk" not in result.output
