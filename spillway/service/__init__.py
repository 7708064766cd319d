"""The cluster and the service: options, launchers, worker plugins, the tiered memory
store, the job service and the CLI. Users import :mod:`spillway`, which re-exports what
they type (``spillway.local``, ``spillway.connect``, ``spillway.Options``)."""
