"""The service's own files kept to its owner, whichever command makes them first: the
state directory 0700 and the SQLite database 0600, with its ``-wal`` and ``-shm`` files
(they hold every tenant's token digests, jobs and parameters). ``spillway tenant add`` on a
fresh state directory, the README's first step, left them 0755 and 0644 (issue 63)."""

from __future__ import annotations

import os
from pathlib import Path

#: the files SQLite keeps beside its database (WAL mode)
SIDE_FILES = ("-wal", "-shm", "-journal")


def private_directory(path: str | Path) -> Path:
    """``path`` made 0700 where missing (its parents as the umask makes them); an existing
    directory is left as its owner set it."""
    path = Path(path).expanduser()
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode passes through the umask
    return path


def private_database(path: str | Path) -> None:
    """The SQLite database at ``path`` and its side files 0600, the database made empty at
    that mode where missing, so that SQLite (which gives its side files the database's mode)
    never makes any of them readable to others."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in SIDE_FILES:
        side = Path(str(path) + suffix)
        try:
            fd = os.open(side, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
