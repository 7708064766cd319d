"""The out-of-core matrix: every computation on the cluster past the GPUs' memory.

Each case is one computation at a size whose projected footprint is at least ``factor``
(1.3 on the GPU host) times the GPUs' memory, run one of five ways:

- ``cli``: a catalogue workflow with seeded inputs through ``spillway run --verify --json``
  in a subprocess (its own cluster, from the defaults);
- ``notebook``: the same workflow on ``spillway.local()``, its input generated from the
  seed and persisted by the user first (``client.persist``), then handed to the workflow
  as an array input and computed through the notebook's ``compute``;
- ``user-code``: dask code a user writes on persisted inputs (tall-skinny QR, SVD and
  least squares, a matmul, ``map_overlap``, reductions, a rechunk with dask's defaults);
- ``service``: rechunk, matmul and svd through ``spillway serve`` on loopback, submitted
  with ``verify=True`` by a tenant added with no options (:mod:`.entry`);
- ``batch``: the same three as the rendered one-node Slurm script, run with the ``srun``
  stand-in on a host without Slurm (:mod:`.entry`).

Every case ends with its answer checked against a NumPy float64 reference computed on
the host from the seeds (relative error), or refused by admission before it starts with
the projected footprint and the cluster's capacity; its row has the bytes each move
between device, host and disk carried and its copy bound (:mod:`spillway_bench.copybound`)
next to its time.

Modules: :mod:`.scale` (how large), :mod:`.cases` (which cases, their workflow
parameters), :mod:`.user_code` (the user-written computations), :mod:`.run` (one case on
its path, its row), :mod:`.table` (``<machine>-<date>-ooc-matrix.{json,md,png}``, merged
slice by slice), :mod:`.slices` (named slices that fit one device call, their time
estimates and the command that runs one: ``spillway bench --matrix SLICE``).
"""

from __future__ import annotations

from .cases import (ENTRY_WORKFLOWS, OWN_CLUSTER, PATHS, USER_CODE_NAMES, Case, case_by_id, cases, catalogue, seeded_inputs, workflow_params)
from .rows import row
from .run import run_case, run_cli, run_notebook, run_user_code, with_bound
from .scale import GPU_FACTOR, SEED, SIZE_SLACK, Scale, cpu_scale, gpu_scale, grow
from .table import merge_files, table_stem, write_table
from .user_code import LSTSQ_TOLERANCE, TOLERANCE, USER_CODE, UserBuilt, laplacian_2d, user_size

__all__ = [
    "ENTRY_WORKFLOWS", "GPU_FACTOR", "LSTSQ_TOLERANCE", "OWN_CLUSTER", "PATHS", "SEED", "SIZE_SLACK", "TOLERANCE", "USER_CODE", "USER_CODE_NAMES",
    "Case", "Scale", "UserBuilt", "case_by_id", "cases", "catalogue", "cpu_scale", "gpu_scale", "grow",
    "laplacian_2d", "merge_files", "row", "run_case", "run_cli", "run_notebook", "run_user_code", "seeded_inputs",
    "table_stem", "with_bound", "workflow_params", "write_table", "user_size",
]
