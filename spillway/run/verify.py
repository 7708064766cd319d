"""A run's result checked against the workflow's own reference, by relative error.

:func:`check` builds the NumPy float64 reference in the calling process: right for a
notebook or ``spillway run``, whose process is the user's. A service must not: the
reference of a 16000x16000 input took the API process from 432 MiB to 4.3 GiB (issue 45).
:class:`ChildReference` builds it in a child process of its own instead (a fresh
interpreter, never a fork of the service's threads), a bounded number at once, each killed
past a memory limit; the service's memory stays where it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from spillway.cluster.errors import SpillwayError
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


class ReferenceCheckError(SpillwayError):
    """The reference check could not be made (its process ran out of its memory or failed)."""


@dataclass
class _Check:
    """What the child needs of a built run: its reference, what it checks and how closely."""

    reference: Callable[[Any], tuple[Any, str]] | None
    checked: Callable[[Any], Any]
    tolerance: float


class ChildReference:
    """``check`` in a child process: at most ``processes`` at once (the others wait their
    turn), each killed once its resident memory passes ``max_bytes`` (default: half the
    host's memory over ``processes``). Pass it as ``run_workflow(verify_with=...)``."""

    def __init__(self, processes: int = 1, max_bytes: int | None = None, poll_s: float = 0.1):
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.processes = processes
        if max_bytes is None:
            import psutil

            max_bytes = psutil.virtual_memory().total // 2 // processes
        self.max_bytes = int(max_bytes)
        self.poll_s = poll_s
        self._slots = threading.BoundedSemaphore(processes)

    def __call__(self, built, value) -> dict:
        if built.reference is None:
            return check(built, value)
        import cloudpickle

        payload = cloudpickle.dumps((_Check(built.reference, built.checked, built.tolerance), value))
        with self._slots, tempfile.TemporaryDirectory(prefix="spillway-reference-") as tmp:
            given, answer = os.path.join(tmp, "in.pickle"), os.path.join(tmp, "out.pickle")
            with open(given, "wb") as f:
                f.write(payload)
            del payload
            result = self._run(given, answer)
        result["reference_process"] = True
        return result

    def _run(self, given: str, answer: str) -> dict:
        import pickle

        import psutil

        from spillway.cluster.sizes import format_bytes

        proc = subprocess.Popen([sys.executable, "-m", "spillway.run.verify", given, answer],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        peak, killed = 0, False
        try:
            watched = psutil.Process(proc.pid)
            while proc.poll() is None:
                try:
                    rss = watched.memory_info().rss
                except psutil.Error:
                    break
                peak = max(peak, rss)
                if rss > self.max_bytes:
                    killed = True
                    proc.kill()
                    break
                time.sleep(self.poll_s)
        finally:
            _, err = proc.communicate()
        if killed:
            raise ReferenceCheckError(f"verify: the NumPy reference needed more than {format_bytes(self.max_bytes)} "
                                  "of memory, the service's limit for one reference check; not checked")
        if proc.returncode != 0 or not os.path.exists(answer):
            last = (err or b"").decode(errors="replace").strip().splitlines()
            raise ReferenceCheckError(f"verify: the reference check's process exited with code {proc.returncode}"
                                  + (f": {last[-1][:300]}" if last else ""))
        with open(answer, "rb") as f:
            outcome = pickle.load(f)
        if "error" in outcome:
            raise ReferenceCheckError(f"verify: {outcome['error']}")
        outcome["reference_peak_bytes"] = peak
        return outcome


def _child(given: str, answer: str) -> None:
    """The child's side: read the check and the value, write the outcome (or its error)."""
    import pickle

    with open(given, "rb") as f:
        spec, value = pickle.load(f)
    try:
        outcome = check(spec, value)
    except Exception as e:  # noqa: BLE001 (the parent reports it as the check's failure)
        outcome = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
    with open(answer + ".part", "wb") as f:
        pickle.dump(outcome, f)
    os.replace(answer + ".part", answer)


if __name__ == "__main__":
    _child(*sys.argv[1:3])
