"""The registry: catalogue and schemas, lazy building, strict parameters, footprints."""

from __future__ import annotations

import json

import dask
import jsonschema
import pytest
from click.testing import CliRunner

from spillway import workflows
from spillway.cli import main
from spillway.options.errors import ParamError
from spillway.workflows.params import Target

CPU = Target(kind="cpu", n_workers=2)
GPU = Target(kind="gpu", n_workers=2, worker_bytes=140 * 2**30)


def test_catalogue_lists_every_workflow_with_a_valid_schema():
    entries = workflows.catalogue()
    assert {e["name"] for e in entries} == set(workflows.names())
    expected = {"transpose-sum", "matmul", "rechunk", "fft", "tsqr", "svd", "stencil", "reduction", "slice",
                "gather", "elementwise"}
    assert expected <= set(workflows.names())
    for entry in entries:
        assert entry["description"]
        jsonschema.Draft202012Validator.check_schema(entry["schema"])
        # the defaults themselves satisfy the schema
        defaults = {k: v["default"] for k, v in entry["schema"]["properties"].items() if "default" in v}
        jsonschema.validate(defaults, entry["schema"])


def test_workflows_command_json():
    result = CliRunner().invoke(main, ["workflows", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert [e["name"] for e in listed] == workflows.names()
    assert all(set(e) >= {"name", "description", "schema"} for e in listed)


def test_gpu_defaults_use_gigabytes():
    """On CPU workers the defaults are tens of MB (seconds); on GPUs they are gigabytes."""
    for name in workflows.names():
        _, cpu_built = workflows.get(name).build_run({}, CPU)
        _, gpu_built = workflows.get(name).build_run({}, GPU)
        assert cpu_built.footprint.input_bytes < 300 * 2**20, name
        assert gpu_built.footprint.input_bytes >= 2 * 10**9, name


def _refuse(*args, **kwargs):
    raise AssertionError("building a workflow computed something")


@pytest.mark.parametrize("name", workflows.names())
@pytest.mark.parametrize("target", [CPU, GPU], ids=["cpu", "gpu"])
def test_building_computes_nothing(name, target):
    """A scheduler that raises if called: building (even a GPU run of gigabytes) must
    only describe the work."""
    with dask.config.set(scheduler=_refuse):
        params, built = workflows.get(name).build_run({}, target)
    assert built.footprint.per_worker_bytes > 0
    assert built.footprint.total_bytes >= built.footprint.per_worker_bytes
    assert dask.is_dask_collection(built.result) or all(dask.is_dask_collection(r) for r in built.result)


def test_footprint_is_stated_per_worker_and_in_total():
    _, built = workflows.get("matmul").build_run({"size": "4000x4000", "chunks": "1000x1000"}, Target(n_workers=4))
    fp = built.footprint
    inputs_and_output = 3 * 4000 * 4000 * 8
    assert fp.input_bytes == 2 * 4000 * 4000 * 8
    assert fp.total_bytes >= inputs_and_output
    assert inputs_and_output / 4 <= fp.per_worker_bytes < inputs_and_output


BAD = [
    ("transpose-sum", {"size": "0x0"}, "size: '0x0' must have dimensions >= 1"),
    ("transpose-sum", {"size": [-5, 5]}, "must have dimensions >= 1"),
    ("transpose-sum", {"size": "0GB"}, "size"),
    ("transpose-sum", {"size": "100x100", "chunks": "200x200"}, "larger than the array"),
    ("reduction", {"size": "10x10", "chunks": "5x50"}, "larger than the array"),
    ("transpose-sum", {"sise": "10x10"}, "sise: not a parameter of transpose-sum (did you mean size?)"),
    ("transpose-sum", {"seed": "abc"}, "seed: 'abc' is not an integer"),
    ("transpose-sum", {"seed": 1.5}, "seed: 1.5 is not an integer"),
    ("transpose-sum", {"seed": -1}, "seed: -1 is below the minimum"),
    ("transpose-sum", {"dtype": "int8"}, "dtype: 'int8' is not a supported dtype"),
    ("transpose-sum", {"size": "3000000000x3000000000"}, "has more than"),
    ("transpose-sum", {"size": "99999PB"}, "exceeds the largest supported size"),
    ("transpose-sum", {"size": "10x20"}, "is not square"),
    ("reduction", {"op": "median"}, "op: 'median' is not one of sum, mean, std, histogram"),
    ("reduction", {"op": "histogram", "low": 1.0, "high": 0.0}, "low: 1.0 must be below high"),
    ("reduction", {"bins": True}, "bins: True is not an integer"),
    ("stencil", {"ndim": 4}, "ndim: 4 is not one of 2, 3"),
    ("stencil", {"size": "100x100", "chunks": "2x2", "depth": 3}, "depth: 3 is larger than a chunk"),
    ("tsqr", {"size": "100x200"}, "is not tall-skinny"),
    ("tsqr", {"size": "1000x50", "chunks": "20x50"}, "shorter than the 50 columns"),
    ("matmul", {"input": "/nonexistent/x.zarr"}, "input: '/nonexistent/x.zarr' does not exist"),
    ("gather", {"count": 2**40}, "count: 1099511627776 is above the maximum"),
    ("slice", {"step": 0}, "step: 0 is below the minimum 1"),
    ("reduction", {"size": "-5GB"}, "size: '-5GB'"),
    ("reduction", {"chunks": "0x10"}, "chunks: '0x10' must have dimensions >= 1"),
    ("reduction", {"chunks": [10, "a"]}, "chunks: [10, 'a'] is not a list of integers"),
    ("reduction", {"size": "1PB"}, "more than the limit of 2000000; use larger chunks"),
    ("rechunk", {"size": "10000000x100000", "chunks": "1x100000"}, "more than the limit of 2000000"),
]


@pytest.mark.parametrize("name,raw,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_parameters_fail_with_one_line(name, raw, message):
    with pytest.raises(ParamError) as info:
        workflows.get(name).validate(raw, CPU)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_unknown_workflow():
    with pytest.raises(ParamError, match="workflow 'transpose_sum' is unknown \\(did you mean transpose-sum\\?\\)"):
        workflows.get("transpose_sum")


def test_cli_bad_parameter_exits_2_before_starting(tmp_path):
    result = CliRunner().invoke(main, ["run", "nonesuch", "--cpu"])
    assert result.exit_code == 2
    assert "workflow 'nonesuch' is unknown" in result.output
    result = CliRunner().invoke(main, ["run", "rechunk", "--cpu", "--output", str(tmp_path / "no" / "x.zarr")])
    assert result.exit_code == 2
    assert "output: directory" in result.output and "does not exist" in result.output


def test_zarr_path_that_is_not_a_store(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ParamError, match="is not a Zarr array"):
        workflows.get("reduction").validate({"input": str(tmp_path / "plain")}, CPU)


def test_gpu_built_of_a_large_input_spreads_it_evenly():
    """Built for two GPUs (nothing runs), a 16 GB input larger than half a GPU carries a
    per-chunk placement within 10% of an even share, kept through to the scheduler."""
    target = Target(kind="gpu", n_workers=2, worker_bytes=20 * 10**9, workers=("ucx://a:1", "ucx://b:1"))
    with dask.config.set(scheduler=_refuse):
        _, built = workflows.get("reduction").build_run({"op": "sum", "size": "16GB"}, target)
    assert built.optimize_graph is False  # low-level fusion would drop the annotations
    placed = {}
    for layer in built.result.dask.layers.values():
        if layer.annotations and "workers" in layer.annotations:
            for key in layer:
                (worker,) = layer.annotations["workers"](key)
                placed[worker] = placed.get(worker, 0) + 1
            assert layer.annotations["allow_other_workers"] is True
    assert set(placed) == {"ucx://a:1", "ucx://b:1"}
    assert max(placed.values()) - min(placed.values()) <= 1 + 0.1 * sum(placed.values()) / 2
    # a small input is left to the scheduler
    _, small = workflows.get("reduction").build_run({"op": "sum", "size": "1GB"}, target)
    assert small.optimize_graph is True


def test_other_packages_add_workflows_through_entry_points(tmp_path, monkeypatch):
    from importlib.metadata import EntryPoint

    from spillway.workflows import registry

    (tmp_path / "extra_workflows.py").write_text(
        "from spillway.workflows import Workflow, BuiltRun, Footprint, Param\n"
        "def build(params, target):\n"
        "    import dask.array as da\n"
        "    return BuiltRun(result=da.ones(params.n, chunks=10).sum(), footprint=Footprint(8, 8),\n"
        "                    summarize=lambda v: {'sum': float(v)})\n"
        "WORKFLOW = Workflow(name='ones-sum', description='sum of ones', build=build,\n"
        "                    params=(Param('n', 'int', 'length', default=30, minimum=1),))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(name="ones-sum", value="extra_workflows:WORKFLOW", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points",
                        lambda group: [point] if group == registry.ENTRY_POINT_GROUP else [])
    workflows.names()  # the built-ins are registered
    # a copy of the registry, put back after the test, and loading entry points once more
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_LOADED", False)
    assert "ones-sum" in workflows.names()
    assert "transpose-sum" in workflows.names()
    _, built = workflows.get("ones-sum").build_run({"n": 25})
    assert float(built.result.compute(scheduler="sync")) == 25.0


def test_sizes_in_bytes():
    """Bytes give a square (or cubic) shape, or a tall-skinny one of the given columns."""
    _, built = workflows.get("transpose-sum").build_run({"size": "8MB"}, CPU)
    assert built.footprint.input_bytes == 1000 * 1000 * 8
    _, built = workflows.get("stencil").build_run({"ndim": 3, "size": "8MB", "dtype": "float32"}, CPU)
    assert built.footprint.input_bytes == 125**3 * 4  # floor of the cube root of 2e6
    params, built = workflows.get("tsqr").build_run({"size": "64MB", "columns": 40}, CPU)
    assert built.footprint.input_bytes == (64 * 10**6 // (40 * 8)) * 40 * 8
    assert built.array.shape == (64 * 10**6 // (40 * 8), 40)
