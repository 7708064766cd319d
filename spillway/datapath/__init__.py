"""The data path between workers: how chunks move from one worker to another.

- :mod:`.plane`: the data plane, distributed's worker-to-worker gathers carried over
  persistent UCXX endpoints where both ends have one;
- :mod:`.step`: rechunks, FFT axis swaps and map_overlap's halos as one step a worker
  (cut, sent over a transport of the step's own, received into the outputs), the output
  chunks getters of it;
- :mod:`.collective`: the exchange's plan, its graph and its copy kernel, and its
  pieces' tasks (``exchange: pieces``: each worker cuts its inputs, the assemblies take
  their pieces from every worker in bulk);
- :mod:`.transfer`: which transport the workers' UCX setup gives them (CUDA IPC or
  staged through the host).

It stands on the tiered store (:mod:`spillway.memory`), whose values it moves, and below
the launchers, which register its plugins.
"""
