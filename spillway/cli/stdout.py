"""One JSON object on stdout, whatever else the process and its children print.

UCX prints its warnings (``UCX WARN unused environment variable ...``) from C code, to
file descriptor 1, in this process and in every worker process that inherits it; Python's
``sys.stdout`` or ``contextlib.redirect_stdout`` never sees them. While a ``--json``
command runs, fd 1 therefore points at fd 2 (stderr), and the report is written to a
duplicate of the original stdout that only :meth:`JsonStdout.emit` writes to.
"""

from __future__ import annotations

import io
import os
import sys


class JsonStdout:
    """Context manager: fd 1 goes to stderr inside the block; :meth:`emit` writes to the
    stdout the process was started with.

    Where ``sys.stdout`` is not the process's fd 1 (click's CliRunner, pytest's capsys)
    there is no descriptor to move and nothing else writes to that stream, so :meth:`emit`
    writes to ``sys.stdout`` and fd 1 is left alone.
    """

    def __init__(self, *, restore: bool = True):
        #: put fd 1 back on leaving the block. The command line passes False: C code may
        #: still print while the interpreter shuts down, and that must not follow the report.
        self.restore = restore
        self._saved: int | None = None
        self._stream = None

    def __enter__(self) -> JsonStdout:
        self._stream = sys.stdout
        if not _is_fd1(self._stream):
            return self
        self._stream.flush()
        self._saved = os.dup(1)
        os.dup2(2, 1)
        return self

    def emit(self, text: str) -> None:
        """Write ``text`` and a newline to the original stdout."""
        data = (text + "\n").encode()
        if self._saved is None:
            self._stream.write(text + "\n")
            self._stream.flush()
            return
        while data:
            data = data[os.write(self._saved, data):]

    def __exit__(self, *exc) -> None:
        if self._saved is None:
            return
        # what Python buffered inside the block belongs to stderr, like the rest of it
        self._stream.flush()
        if self.restore:
            os.dup2(self._saved, 1)
        os.close(self._saved)
        self._saved = None


def _is_fd1(stream) -> bool:
    try:
        return stream.fileno() == 1
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False
