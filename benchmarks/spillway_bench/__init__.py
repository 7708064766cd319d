"""``spillway bench``: spillway against plain dask-cuda (or distributed) in one run.

:func:`prepare` fixes everything before memory is taken; :func:`run_bench` measures the
ceilings, runs every workload on its sides' clusters, compares the rows with the previous
result of the machine and writes the files. A distribution of its own
(``pip install -e ./benchmarks``) that only the CLI's bench commands import;
``benchmarks/README.md`` says what it measures.
"""

from .clusters import bench_options
from .harness import BenchRun
from .suite import prepare, run_bench
from .workloads import WORKLOADS

__all__ = ["BenchRun", "WORKLOADS", "bench_options", "prepare", "run_bench"]
