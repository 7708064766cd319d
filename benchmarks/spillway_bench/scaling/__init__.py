"""The scaling study: how ``spillway bench``'s times and worker-to-worker bandwidth change
from 2 to 4 to 8 workers of one host.

Two modes. **Strong** scaling keeps each workload's size at the chosen scale, whatever
the worker count. **Weak** scaling keeps the data per worker that the workload has on
:data:`BASE_WORKERS` workers: the array grows with the worker count along the axes
:data:`GROWTH` names, in whole steps of its chunk shape, so chunk shapes stay the
workload's and the number of chunks per worker stays (within one row of chunks) the
same. At :data:`BASE_WORKERS` workers both modes run the same sizes, so one run there
serves both.

The harness runs a workload at a scaled size without knowing of it: :func:`scaled`
returns a copy of the workload whose only size, under the scale the harness is asked
for, is the scaled one, and :func:`run_study` puts those copies into the bench run
:func:`~spillway_bench.prepare` made (:mod:`.run`).

One study run is cut into parts (:data:`PARTS`), each written into the first part's
results file as soon as it ends, so a command stopped at a time limit keeps what it
finished; no part starts once ``budget_s`` has passed. :func:`combine` reads the runs of
several worker counts back and tabulates them (:mod:`.combined`).
"""

from __future__ import annotations

from .combined import combine, efficiency, load_runs, machine_kind, markdown, plot, text_table, write_report
from .sizes import (BASE_WORKERS, GROWTH, LEFT_OUT, MODES, PARTS, STUDY, growth_step, modes_at, row_bytes, scaled, scaled_params, strong_params, study, weak_params)
from .run import file_label, run_study

__all__ = ["BASE_WORKERS", "GROWTH", "LEFT_OUT", "MODES", "PARTS", "STUDY", "combine", "efficiency", "file_label",
           "growth_step", "load_runs", "machine_kind", "markdown", "modes_at", "plot", "row_bytes", "run_study",
           "scaled", "scaled_params", "strong_params", "study", "text_table", "weak_params", "write_report"]
