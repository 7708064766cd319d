"""Progress under any terminal: a pseudo-terminal opened without a size (0 columns, 0 rows:
`script`, some CI runners) still gets a bar; tqdm, sized by it, drew nothing (issue 75)."""

from __future__ import annotations

import os
import pty
import select
import sys

from spillway.run.bars import advance, progress_bar
from spillway.run.progress import wait_with_bar


def drawn(master: int) -> str:
    """What the terminal shows so far: everything written to its other end."""
    chunks = []
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end is closed and nothing is left
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class Finished:
    def done(self) -> bool:
        return True


class Counts:
    def read(self) -> dict:
        return {"total": 12, "done": 12, "bytes": 4096, "erred": 0}


def test_bars_are_drawn_on_a_terminal_of_no_size(monkeypatch):
    master, slave = pty.openpty()  # a new pseudo-terminal reports no size, as script's does
    try:
        with os.fdopen(slave, "w", closefd=True) as tty:
            assert tuple(os.get_terminal_size(tty.fileno())) == (0, 0)
            # a stream given (cluster.run(progress=...)), the service client's default
            # (stderr when it is a terminal), and `spillway run`'s own bar
            bar = progress_bar("given", tty)
            advance(bar, 3, 10, "running")
            bar.close()
            monkeypatch.setattr(sys, "stderr", tty)
            bar = progress_bar("job", True)
            assert bar is not None
            advance(bar, 7, 10)
            bar.close()
            last = wait_with_bar(Finished(), Counts(), label="transpose-sum", stream=tty, interval=0.01)
            tty.flush()
            text = drawn(master)
    finally:
        os.close(master)
    assert last["done"] == 12
    assert "given:  30%" in text and "3/10" in text and "running" in text, text
    assert "job:  70%" in text and "7/10" in text, text
    assert "transpose-sum: 100%" in text and "12/12 tasks" in text, text
