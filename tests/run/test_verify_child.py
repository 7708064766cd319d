"""The reference check in a child process (what the service runs): the same answer as the
check in this process, this process's memory untouched, and a reference past its memory
limit killed with one line."""

from __future__ import annotations

import dask
import psutil
import pytest

from spillway import workflows
from spillway.run.verify import ChildReference, ReferenceCheckError, check
from spillway.workflows.params import Target


def _run(name, params):
    _, built = workflows.get(name).build_run(params, Target(kind="cpu", n_workers=1))
    (value,) = dask.compute(built.result, scheduler="sync")
    return built, value


@pytest.mark.parametrize("name, params", [
    ("transpose-sum", {"size": "600x600", "chunks": "200x200"}),
    ("rechunk", {"size": "400x400", "chunks": "100x100"}),
    ("matmul", {"size": "300x300", "chunks": "100x100"}),
])
def test_the_child_gives_the_same_answer(name, params):
    built, value = _run(name, params)
    here = check(built, value)
    there = ChildReference()(built, value)
    assert there["ok"] is True and there["rel_error"] == here["rel_error"] and there["reference"] == here["reference"]
    assert there["reference_process"] is True and there["reference_peak_bytes"] > 0


def test_this_process_keeps_its_memory_and_a_greedy_reference_is_killed():
    built, value = _run("transpose-sum", {"size": "4000x4000", "chunks": "1000x1000"})
    rss = psutil.Process().memory_info().rss
    result = ChildReference()(built, value)
    assert result["ok"] is True and result["reference_peak_bytes"] > 256 * 2**20  # the 128 MB input, twice
    assert psutil.Process().memory_info().rss - rss < 32 * 2**20
    with pytest.raises(ReferenceCheckError, match=r"^verify: the NumPy reference needed more than 200\.00 MiB of "
                                                  r"memory, the service's limit for one reference check; not checked$"):
        ChildReference(max_bytes=200 * 2**20)(built, value)
