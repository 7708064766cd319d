"""The shared service (``spillway serve``): workflows run on one cluster for many tenants.

- :mod:`.api`: the HTTP API (FastAPI), its settings, limits, metrics and web page;
- :mod:`.jobs`: the job queue and the order jobs start in;
- :mod:`.jobdb`: the job database (SQLAlchemy), its schema, rows and tokens;
- :mod:`.client`: the Python client of the API (``spillway.connect``).

It runs workflows through :mod:`spillway.run` on a cluster from :mod:`spillway.launch`;
the command that starts it is :mod:`spillway.cli.serve`."""
