"""Which transport carries chunks between workers, read from the workers' own UCX setup.

Over the ``ucx`` protocol a GPU buffer goes straight from one GPU to the other (CUDA IPC,
over NVLink where the GPUs have it) only when UCX's ``cuda_ipc`` transport is enabled;
otherwise UCX stages it through host memory. Which transports UCX uses is decided in the
worker process, in this order (as distributed-ucxx applies them): the ``UCX_TLS``
environment variable, the high-level flags dask-cuda sets in the ``distributed-ucxx``
config (``nvlink`` adds ``cuda_ipc``), ``UCX_TLS`` given under its ``environment`` key,
and UCX's own default (``all``). When ucxx's context is already up, its config is what UCX
really uses and comes first.

:func:`describe` is a pure function over those settings; :func:`worker_settings` reads
them on a worker (``client.run``), :func:`transport` asks every worker of a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

IPC = "ucx (CUDA IPC over NVLink)"
#: CUDA IPC between workers of one GPU: a copy within the device's memory
IPC_SAME_GPU = "ucx (CUDA IPC within one GPU)"
IPC_BOTH = "ucx (CUDA IPC within a GPU and over NVLink between GPUs)"
STAGED = "ucx (staged through host)"
#: TCP between workers of one GPU: each chunk goes device -> host -> socket -> host -> device
TCP_SAME_GPU = "tcp (workers share a GPU; chunks staged through host memory)"

#: UCX transport names that include CUDA IPC ("cuda" is UCX's alias for its CUDA transports)
_IPC_NAMES = {"cuda_ipc", "cuda", "all"}

#: the config namespaces distributed-ucxx reads, newest first
NAMESPACES = ("distributed-ucxx", "distributed.comm.ucx")


def cuda_ipc_enabled(tls: str) -> bool:
    """Whether a ``UCX_TLS`` value lets UCX use CUDA IPC (``^a,b`` excludes a and b)."""
    names = [n.strip().lower() for n in tls.split(",") if n.strip()]
    if not names:
        return True  # empty is UCX's default: all transports
    if names[0].startswith("^"):
        excluded = {names[0][1:], *names[1:]}
        return not excluded & {"cuda_ipc", "cuda"}
    return bool(set(names) & _IPC_NAMES)


def _get(config: Mapping, key: str):
    """A distributed-ucxx setting, falling back to the legacy namespace like it does."""
    for ns in NAMESPACES:
        section = config.get(ns) or {}
        value = section.get(key, section.get(key.replace("-", "_")))
        if value is not None:
            return value
    return None


def effective_tls(env: Mapping[str, str], config: Mapping, context: Mapping | None = None) -> str:
    """The ``UCX_TLS`` a worker's UCX runs with, from its context config, environment
    and dask config (see the module's docstring for the order)."""
    if context and context.get("TLS"):
        return str(context["TLS"])
    if env.get("UCX_TLS"):
        return env["UCX_TLS"]
    if any(_get(config, k) for k in ("tcp", "nvlink", "infiniband")):
        tls = "tcp"
        if _get(config, "nvlink") or _get(config, "cuda-copy"):
            tls += ",cuda_copy"
        if _get(config, "infiniband"):
            tls = "rc," + tls
        if _get(config, "nvlink"):
            tls += ",cuda_ipc"
        return tls
    environment = _get(config, "environment") or {}
    return str(environment.get("tls") or environment.get("TLS") or "all")


def describe(protocol: str, env: Mapping[str, str] | None = None, config: Mapping | None = None,
             context: Mapping | None = None) -> str:
    """The transport label for a worker speaking ``protocol`` with these UCX settings."""
    scheme = protocol.split("://", 1)[0].lower()
    if scheme not in ("ucx", "ucxx"):
        return {"tcp": "tcp", "": "tcp", "tls": "tcp (TLS)"}.get(scheme, scheme)
    return IPC if cuda_ipc_enabled(effective_tls(env or {}, config or {}, context)) else STAGED


def on_gpus(label: str, gpus) -> str:
    """``label`` (:func:`describe`'s) told apart by where the workers are: ``gpus`` names
    each worker's GPU (None where not known); CUDA IPC between workers of one GPU is a copy
    within it, between GPUs it crosses NVLink."""
    known = [g for g in gpus if g is not None]
    shared = len(set(known)) < len(known)
    several = len(set(known)) > 1
    if label == IPC and shared:
        return IPC_BOTH if several else IPC_SAME_GPU
    if label == "tcp" and shared and not several:
        return TCP_SAME_GPU
    return label


def worker_gpu() -> str | None:
    """The GPU of this worker process: the first of its ``CUDA_VISIBLE_DEVICES`` (dask-cuda
    puts the worker's own GPU first), None where unset."""
    import os

    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[0] if visible else None


def worker_settings(dask_worker=None) -> dict:
    """What :func:`describe` needs, read in a worker process (``client.run``)."""
    import os
    import sys

    import dask.config

    protocol = dask_worker.address.split("://", 1)[0]
    context = None
    ucxx = sys.modules.get("ucxx")
    if protocol in ("ucx", "ucxx") and ucxx is not None and hasattr(ucxx, "get_config"):
        try:  # the running context's config; only read where the comm already started it
            context = {str(k): str(v) for k, v in ucxx.get_config().items()}
        except Exception:
            context = None
    return {
        "protocol": protocol,
        "env": {k: v for k, v in os.environ.items() if k.startswith("UCX_")},
        "config": {ns: dask.config.get(ns, default={}) or {} for ns in NAMESPACES},
        "context": context,
        "gpu": worker_gpu(),
    }


def transport(client) -> str:
    """The transport between the workers of ``client``'s cluster (several labels joined
    with "; " where workers differ)."""
    settings = client.run(worker_settings)
    if not settings:
        return describe(client.scheduler.address)
    gpus = [s.get("gpu") for s in settings.values()]
    labels = sorted({on_gpus(describe(s["protocol"], s["env"], s["config"], s["context"]), gpus)
                     for s in settings.values()})
    return "; ".join(labels)


def planned(protocol: str, nvlink: bool, env: Mapping[str, str] | None = None, gpus=()) -> str:
    """The transport a spillway cluster started with ``protocol`` and ``nvlink`` will use,
    its workers on ``gpus`` (one entry per worker): dask-cuda turns on TCP and CUDA copies
    over UCX, and CUDA IPC with ``nvlink`` (which UCX's cuda_ipc also uses within a GPU)."""
    config = {"distributed-ucxx": {"tcp": True, "cuda-copy": True, "nvlink": nvlink}}
    return on_gpus(describe(protocol, env if env is not None else {}, config), gpus)
