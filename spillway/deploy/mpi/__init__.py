"""A cluster started by MPI through dask-mpi: rank 0 runs the scheduler and the workflow,
every other rank one worker (one GPU each).

The pure parts (which GPU a rank takes, the worker keywords) live in :mod:`.layout`;
:mod:`.launch` imports mpi4py and dask-mpi (the ``mpi`` extra) only when it runs.
"""
