"""The clusters a notebook holds: ``spillway.local()`` and ``spillway.slurm()``.

- :mod:`.base`: :class:`~.base.Cluster`, what both are: the client, registered workflows
  run as ``spillway run`` runs them, users' collections with the same progress bar and
  worker-loss watch, and dask's Cluster verbs on the cluster underneath;
- :mod:`.local`: the embedded cluster on one's own machine (:func:`spillway.launch.open_cluster`);
- :mod:`.slurm`: a cluster of Slurm jobs (the launcher :mod:`spillway.launch.slurm_jobs`,
  with spillway's job script).

Each is a thin entry point: what starts the workers is a launcher of
:mod:`spillway.launch`. They sit above :mod:`spillway.run`, whose runs they hand out;
:mod:`spillway` re-exports :func:`~.local.local` and :func:`~.slurm.slurm`.
"""
