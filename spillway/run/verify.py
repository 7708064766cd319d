"""A run's result checked against the workflow's own reference, by relative error."""

from __future__ import annotations

import time

from spillway.workflows.workflow import relative_error


def check(built, value) -> dict:
    if built.reference is None:
        return {"rel_error": None, "tolerance": built.tolerance, "ok": None, "reference": "none"}
    t0 = time.perf_counter()
    expected, how = built.reference(value)
    err = relative_error(built.checked(value), expected)
    return {
        "rel_error": err,
        "tolerance": built.tolerance,
        "ok": bool(err <= built.tolerance),
        "reference": how,
        "reference_s": time.perf_counter() - t0,
    }
