"""The sides a workload runs on, the cluster each starts and the dask settings its graph
is built under: ``spillway``, ``baseline``, and for O3-O5 ``tasks_method`` (spillway's
cluster, the user's rechunk or halos built by dask's task-based method).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def _spillway_session(config: Mapping) -> dict:
    """What ``spillway.local()`` sets for the user's code while its cluster is open: a
    rechunk whose method the user left unset takes P2P, which spillway's clusters route to
    their collective (:func:`spillway.clusters.base.session_config`)."""
    from spillway.clusters.base import session_config

    return session_config(config)


@dataclass(frozen=True)
class Side:
    name: str
    #: the cluster it starts: "spillway" or "baseline"
    cluster: str
    #: (dask's config now) -> the settings the graph is built under
    build_config: Callable[[Mapping], Mapping[str, Any]] = field(default=lambda config: {})
    #: one line for the report
    what: str = ""


SPILLWAY = Side("spillway", "spillway", _spillway_session,
                "spillway's cluster at its defaults, the user's code as `spillway.local()` runs it")
TASKS_METHOD = Side("tasks_method", "spillway", lambda config: {"array.rechunk.method": "tasks"},
                    "spillway's cluster at the same defaults, the graph built under "
                    "dask.config.set({'array.rechunk.method': 'tasks'})")
BASELINE = Side("baseline", "baseline", what="plain dask-cuda (distributed on CPU), the same user code")

#: every side by name, in the order the reports list them
SIDES: dict[str, Side] = {s.name: s for s in (SPILLWAY, TASKS_METHOD, BASELINE)}
NAMES = tuple(SIDES)
