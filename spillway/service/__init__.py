"""The cluster and the service: options, launchers, worker plugins, the tiered memory
store, the job service and the CLI. Users import :mod:`spillway`, which re-exports what
they type (``spillway.local``, ``spillway.connect``, ``spillway.Options``).

The package holds three layers, each importing only those below it (``tests/test_layers.py``
holds the table and says why): the cluster core (the modules at this level, ``launch`` and
``memory``), which knows no workflow; :mod:`.run`, :mod:`.local` and :mod:`.preflight`, which
run :mod:`spillway.workflows` on a cluster; and the shared service (``api``, ``jobs``,
``jobdb``, ``client``). The CLI (``cli``) sits on all of them, beside :mod:`spillway.bench`."""
