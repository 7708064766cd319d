"""An exchange (a rechunk, a transpose's or an FFT's axis swap, map_overlap's halos) as one
step a worker: each worker's step cuts its input chunks, sends every peer its pieces over
a transport that runs outside the worker's event loop, and joins what it receives; the
output chunks are dask keys, getters of what the steps stored.

- :mod:`.layout`: who cuts, sends and joins what, from the plan alone (no size is sent);
- :mod:`.names`: the names of the steps' and outputs' keys;
- :mod:`.graph`: the step and getter tasks of an exchange;
- :mod:`.task`: those tasks as they run on the workers (and on dask's local schedulers);
- :mod:`.transport`, :mod:`.ucx`, :mod:`.tcp`: moving the steps' buffers (UCXX's core
  API; TCP a peer), and choosing one an exchange;
- :mod:`.state` and :mod:`.plugin`: what the steps keep on a worker (its transports, the
  attempts the scheduler ended, their phases);
- :mod:`.coordinator`: the scheduler's plugin: binds the steps to workers, joins them,
  restarts an exchange a lost worker broke.

The plan, the graph's choice of way and the copy kernel are the collective's
(:mod:`spillway.datapath.collective`), which builds the step's layers where the option
``exchange`` is ``step``.
"""
