"""A disk tier on a filesystem of a few megabytes, without root (no tmpfs, no loop device):
the real :class:`~spillway.memory.disk.DiskTier` writing real files, with its file
layer's room counted against ``capacity``. A write past it fails as a full filesystem's
does (``OSError(ENOSPC)``, possibly after part of it was written), and the tier reports
that filesystem's size and free space, so the workers' capacity reads it too."""

from __future__ import annotations

import errno
import os
import threading

from spillway.memory.disk import DiskTier


class SmallDisk(DiskTier):
    def __init__(self, directory: str, capacity: int, *, reports: int | None = None, **kwargs):
        super().__init__(directory, **kwargs)
        #: bytes the files may hold together
        self.capacity = int(capacity)
        #: the free space reported (default: the truth); a larger one stands for a disk that
        #: fills while the work runs (another process, a wrong estimate)
        self.reports = reports
        self.full_errors = 0
        self._guard = threading.Lock()

    def on_disk(self) -> int:
        """Bytes the tier's directory holds now (what a filesystem would count)."""
        total = 0
        for entry in os.scandir(self.directory):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def files(self) -> list[str]:
        return sorted(os.listdir(self.directory))

    def usage(self) -> tuple[int, int]:
        free = max(0, self.capacity - self.on_disk())
        return self.capacity, free if self.reports is None else self.reports

    def _pwrite(self, fd: int, data, offset: int) -> None:
        view = memoryview(data).cast("B")
        with self._guard:
            room = self.capacity - self.on_disk()
            if len(view) > room:
                if room > 0:  # as a filesystem does: what fits is written, then ENOSPC
                    os.pwrite(fd, view[:room], offset)
                self.full_errors += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            super()._pwrite(fd, view, offset)
