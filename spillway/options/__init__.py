"""The settings and the facts they are resolved against.

- :mod:`.settings`: :class:`~.settings.Options`, every option with its parser and the
  layers it is read from (keywords and flags, ``DASK_SPILLWAY__*``, dask config, the
  defaults in ``config.yaml``);
- :mod:`.docs`: ``config.yaml``, ``config_schema.yaml`` and the README's table generated
  from the option declarations (``python -m spillway.options.docs --write``);
- :mod:`.sizes`: byte sizes parsed and said as dask says them;
- :mod:`.gpus`: the GPUs, found through NVML without a CUDA context;
- :mod:`.errors`: the errors that reach users as one line.

The room imports nothing else of spillway: every other room reads its settings from here.
"""
