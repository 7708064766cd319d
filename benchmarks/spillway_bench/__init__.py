"""``spillway bench``: spillway against plain dask-cuda (or distributed) in one run.

:func:`prepare` fixes everything before memory is taken (workloads, sizes, the launch
plan, whether the inputs fit); :func:`run_bench` measures the ceilings, runs every
workload on each of its sides' clusters (spillway's alone without the baseline; O3 and O4
add ``tasks_method`` and a fresh cluster per side, :mod:`.sides`), compares the rows with
the previous result of the machine (:mod:`.previous`) and writes the JSON, markdown and
PNG next to a full log. :mod:`spillway_bench.link` is the link sweep.
A distribution of its own (``spillway-bench``, ``benchmarks/pyproject.toml``), beside the
product and not in it: ``pip install -e ./benchmarks`` from a checkout. ``spillway bench``
and ``spillway bench-scaling`` import it when they run.
"""

from .clusters import bench_options
from .harness import BenchRun
from .suite import prepare, run_bench
from .workloads import WORKLOADS

__all__ = ["BenchRun", "WORKLOADS", "bench_options", "prepare", "run_bench"]
