"""What starts clusters elsewhere, rendered from the worker specs and options by plain
functions: what it renders runs the CLI.

- :mod:`.commands`: the scheduler's and the workers' command lines;
- :mod:`.batch`: the batch seam (the batch system, job settings, the script template and
  the refusals every batch system shares);
- :mod:`.slurm`: Slurm on that seam, the one-node stand-in for ``srun`` and the cluster
  of Slurm jobs that ``spillway.slurm()`` drives;
- :mod:`.mpi`: a cluster started by ``mpirun`` or ``srun --mpi``;
- :mod:`.systemd`: the service's unit and environment files."""
