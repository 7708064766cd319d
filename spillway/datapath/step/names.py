"""The names of an exchange's step keys, shared by the graph, its tasks and the scheduler's
plugin (no imports: the workflows build graphs without loading distributed)."""

from __future__ import annotations

# an output chunk's key is ``(OUTPUT_PREFIX + token, *index)``, as the pieces' way names it
from spillway.datapath.collective.names import OUTPUT_PREFIX

#: a step's key is ``(STEP_PREFIX + token, slot)``, and the exchange's name its first part
STEP_PREFIX = "spillway-step-"


def is_step(key) -> bool:
    return (type(key) is tuple and len(key) == 2 and isinstance(key[0], str) and key[0].startswith(STEP_PREFIX)
            and type(key[1]) is int)


def is_output(key) -> bool:
    return type(key) is tuple and len(key) > 1 and isinstance(key[0], str) and key[0].startswith(OUTPUT_PREFIX)
