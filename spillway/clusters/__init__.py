"""The clusters a notebook holds: ``spillway.local()`` and ``spillway.slurm()``.

- :mod:`.base`: :class:`~.base.Cluster`, what both are: the client, registered workflows
  run as ``spillway run`` runs them, users' collections with the same progress bar and
  worker-loss watch, and dask's Cluster verbs on the cluster underneath;
- :mod:`.local`: the embedded cluster on one's own machine;
- :mod:`.slurm`: a cluster of Slurm jobs (deploy's cluster of jobs, with spillway's job
  script).

They sit above :mod:`spillway.run`, whose runs they hand out, and :mod:`spillway.deploy`;
:mod:`spillway` re-exports :func:`~.local.local` and :func:`~.slurm.slurm`.
"""
