"""Host memory and the kernel's OOM killer during one case of the matrix: a thread reads
the host's memory every half second as the store reads it, and the kernel log is read for
OOM kills new since the case started ("unknown" where it cannot be read, never "none"); a
case whose MemAvailable went under the store's headroom
(:func:`spillway.memory.growth.headroom_for`) is flagged.
"""

from __future__ import annotations

import re
import subprocess
import threading

#: seconds between two readings of the host's memory
INTERVAL_S = 0.5
#: the kernel's lines of an OOM kill
_OOM = re.compile(r"Killed process|Out of memory", re.IGNORECASE)


def meminfo() -> dict[str, int]:
    """MemTotal and MemAvailable in bytes, as the tiered store reads them (the machine's,
    within the process's cgroup: :mod:`spillway.memory.growth`), so that a case
    flagged under the headroom is one the store saw there too."""
    from spillway.memory.growth import host_available, host_total

    return {"MemTotal": host_total(), "MemAvailable": host_available()}


def kernel_oom_lines() -> list[str] | None:
    """The kernel log's OOM lines, or None where the log cannot be read (no dmesg, no
    permission: "unknown")."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return [line.strip() for line in done.stdout.splitlines() if _OOM.search(line)]


class HostWatch:
    """Samples the host's memory from a thread while a case runs (``with HostWatch() as w``),
    then :meth:`fields` gives the row's columns."""

    def __init__(self, *, interval: float = INTERVAL_S, read=meminfo, oom_lines=kernel_oom_lines):
        self.interval = interval
        self.read = read
        self.oom_lines = oom_lines
        self.peak_used: int | None = None
        self.min_available: int | None = None
        self.total: int | None = None
        self.samples = 0
        self._before: list[str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spillway-hostwatch", daemon=True)

    def _sample(self) -> None:
        info = self.read()
        if "MemTotal" not in info or "MemAvailable" not in info:
            return
        self.total = info["MemTotal"]
        used = info["MemTotal"] - info["MemAvailable"]
        self.peak_used = used if self.peak_used is None else max(self.peak_used, used)
        available = info["MemAvailable"]
        self.min_available = available if self.min_available is None else min(self.min_available, available)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> HostWatch:
        self._before = self.oom_lines()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()

    def new_oom_kills(self) -> list[str] | None:
        """OOM lines of the kernel log new since the case started; None: unknown."""
        after = self.oom_lines()
        if after is None or self._before is None:
            return None
        before = list(self._before)
        new = []
        for line in after:
            if line in before:
                before.remove(line)  # one old line matches one line of the log now
            else:
                new.append(line)
        return new

    def fields(self) -> dict:
        """The row's columns: peak host memory in use, lowest MemAvailable, the store's
        headroom and whether it was crossed, and the kernel's OOM kills ("unknown" where
        the log could not be read)."""
        from spillway.memory.growth import headroom_for

        headroom = headroom_for(self.total) if self.total else None
        kills = self.new_oom_kills()
        return {"host_peak_used_bytes": self.peak_used, "host_min_available_bytes": self.min_available,
                "host_total_bytes": self.total, "host_headroom_bytes": headroom,
                "under_headroom": (self.min_available < headroom) if headroom and self.min_available is not None
                else None,
                "oom_kills": "unknown" if kills is None else kills}
