"""``spillway bench --matrix``: every computation on the cluster past the GPUs' memory, as
35 cases of five paths (``cli``, ``notebook``, ``user-code``, ``service``, ``batch``), each
at a projected footprint of ``factor`` (1.3) times the GPUs' memory (:mod:`.scale`),
checked against NumPy float64 from the seeds or refused by admission, with its copy bound
and the host's memory; run in slices of one device call (:mod:`.slices`).
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
