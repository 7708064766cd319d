"""A run's result checked against the workflow's own reference, by relative error.

:func:`check` builds the NumPy float64 reference in the calling process: right for a
notebook or ``spillway run``, whose process is the user's. A service must not: the
reference of a 16000x16000 input took the API process from 432 MiB to 4.3 GiB (issue 45).
:class:`ChildReference` builds it in child processes instead (fresh interpreters, never a
fork of the service's threads, each serving one check after another), a bounded number at
once, each killed past a memory limit; the service's memory stays where it was.
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

from spillway.options.errors import SpillwayError
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
    """``check`` in child processes: at most ``processes`` at once (other checks wait their
    turn), each killed once its resident memory passes ``max_bytes`` (default: half the
    host's memory over ``processes``), which fails that check with one line. A child serves
    one check after another (a fresh interpreter costs half a second), and is replaced
    after a check that left it holding more than ``recycle_bytes``. Pass it as
    ``run_workflow(verify_with=...)``; :meth:`close` ends the children."""

    def __init__(self, processes: int = 1, max_bytes: int | None = None, poll_s: float = 0.05,
                 recycle_bytes: int = 512 * 2**20):
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.processes = processes
        if max_bytes is None:
            import psutil

            max_bytes = psutil.virtual_memory().total // 2 // processes
        self.max_bytes = int(max_bytes)
        self.poll_s = poll_s
        self.recycle_bytes = recycle_bytes
        self._slots = threading.BoundedSemaphore(processes)
        self._idle: list[_Child] = []
        self._lock = threading.Lock()
        self._closed = False

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
            with self._lock:
                child = self._idle.pop() if self._idle else None
            if child is None or not child.alive():
                child = _Child()
            keep = False
            try:
                result, keep = child.run(given, answer, self.max_bytes, self.poll_s, self.recycle_bytes)
            finally:
                with self._lock:
                    if keep and not self._closed:
                        self._idle.append(child)
                    else:
                        child.stop()
        result["reference_process"] = True
        return result

    def close(self):
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            child.stop()


class _Child:
    """One child interpreter serving checks: a line ``GIVEN<TAB>ANSWER`` on its stdin per
    check, ``done`` on its stdout when the answer file is written."""

    def __init__(self):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "spillway.run.verify", "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, given: str, answer: str, max_bytes: int, poll_s: float, recycle_bytes: int) -> tuple[dict, bool]:
        """The check's outcome, and whether the child may serve another."""
        import pickle
        import select

        import psutil

        from spillway.options.sizes import format_bytes

        self.proc.stdin.write(f"{given}\t{answer}\n".encode())
        self.proc.stdin.flush()
        watched = psutil.Process(self.proc.pid)
        peak, rss, done = 0, 0, False
        while not done:
            done = bool(select.select([self.proc.stdout], [], [], poll_s)[0])
            try:
                rss = watched.memory_info().rss
            except psutil.Error:
                break
            peak = max(peak, rss)
            if rss > max_bytes:
                self.stop()
                raise ReferenceCheckError(f"verify: the NumPy reference needed more than {format_bytes(max_bytes)} "
                                          "of memory, the service's limit for one reference check; not checked")
            if not done and not self.alive():
                break
        line = self.proc.stdout.readline() if done else b""
        if line.strip() != b"done" or not os.path.exists(answer):
            self.stop()
            self.err.seek(0)
            last = self.err.read().decode(errors="replace").strip().splitlines()
            raise ReferenceCheckError(f"verify: the reference check's process exited with code {self.proc.returncode}"
                                      + (f": {last[-1][:300]}" if last else ""))
        with open(answer, "rb") as f:
            outcome = pickle.load(f)
        if "error" in outcome:
            raise ReferenceCheckError(f"verify: {outcome['error']}")
        outcome["reference_peak_bytes"] = peak
        try:
            rss = watched.memory_info().rss
        except psutil.Error:
            return outcome, False
        return outcome, rss <= recycle_bytes

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.err.close()


def _child(given: str, answer: str) -> None:
    """The child's side: read the check and the value, write the outcome (or its error)."""
    import pickle

    try:
        with open(given, "rb") as f:
            spec, value = pickle.load(f)
        outcome = check(spec, value)
    except Exception as e:  # noqa: BLE001 (the parent reports it as the check's failure)
        outcome = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
    with open(answer + ".part", "wb") as f:
        pickle.dump(outcome, f)
    os.replace(answer + ".part", answer)


def _serve() -> None:
    """A child's loop: one check per line of stdin, ``done`` on stdout after each (what
    the check's code prints goes to stderr, so it cannot be taken for the answer)."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        given, _, answer = line.rstrip("\n").partition("\t")
        _child(given, answer)
        answers.write("done\n")
        answers.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        _child(*sys.argv[1:3])
