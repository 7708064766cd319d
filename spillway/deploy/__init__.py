"""The shared service's files for the machine it runs on, rendered from the options by
plain functions: :mod:`.systemd` (the unit of ``spillway serve`` and its environment
file).

The launchers of clusters (local, attach, ``spillway worker``, MPI, Slurm batch jobs, a
notebook's Slurm jobs) and what they render (command lines, the batch seam's job scripts)
live in :mod:`spillway.launch`, one module each."""
