"""What a run's summary says of its result: the result's own shape, the input's apart."""

from __future__ import annotations

import dask

from spillway import workflows
from spillway.workflows.params import Target


def _summary(name: str, params: dict) -> dict:
    _, built = workflows.get(name).build_run(params, Target())
    (value,) = dask.compute(built.result, scheduler="sync")
    return built.summarize(value)


def test_a_histogram_is_reported_with_its_bins_not_its_input():
    summary = _summary("reduction", {"op": "histogram", "size": "200x300", "chunks": "100x100", "bins": 32})
    assert summary["shape"] == [32] and summary["input_shape"] == [200, 300]
    assert summary["histogram_sum"] == 200 * 300  # every value in [0, 1) is counted once


def test_row_sums_are_reported_with_their_length():
    summary = _summary("reduction", {"op": "sum", "axis": "1", "size": "200x300", "chunks": "100x100"})
    assert summary["shape"] == [200] and summary["input_shape"] == [200, 300]
