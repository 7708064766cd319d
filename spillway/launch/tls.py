"""TLS made for one cluster when it starts (``security: true``, and always under
``spillway serve``): a key and a self-signed certificate that is its own CA, from
distributed's ``Security.temporary()`` (as dask-gateway makes one per cluster), written to
files readable by the cluster's owner only. Scheduler, nannies, workers and clients then
require TLS with a certificate from that CA both ways (distributed's contexts verify the
peer, ``CERT_REQUIRED``), so a process of another local user, which can find the ports in
``/proc/net/tcp`` but cannot read the key, is refused at the handshake before a message is
read. The files travel to the worker processes by path, as given TLS files do."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: the files' names in the directory: the CA is the certificate itself (self-signed)
CA, CERT, KEY = "ca.pem", "cert.pem", "key.pem"


def write_temporary_tls(directory: str | os.PathLike) -> tuple[str, str, str]:
    """A new key and certificate in ``directory`` (made 0700; the files 0600, replaced if
    there); returns the paths of (CA, certificate, key)."""
    from distributed.security import Security

    made = Security.temporary()
    path = Path(directory)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    contents = {CA: made.tls_ca_file, CERT: made.tls_client_cert, KEY: made.tls_client_key}
    for name, text in contents.items():
        target = path / name
        with contextlib.suppress(FileNotFoundError):
            target.unlink()  # a file left by an earlier run, whoever made it, is not reused
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return str(path / CA), str(path / CERT), str(path / KEY)


@contextlib.contextmanager
def temporary_tls(options, directory: str | os.PathLike | None = None) -> Iterator:
    """``options`` with TLS files made for this cluster where ``options.security`` asks for
    them (in ``directory``, else a private temporary one removed at the end); as given
    otherwise."""
    if not options.security or options.attach:
        yield options
        return
    made = None
    if directory is None:
        directory = made = tempfile.mkdtemp(prefix="spillway-tls-")
    try:
        ca, cert, key = write_temporary_tls(directory)
        # the session's options name the files: every client of this cluster needs them
        yield options.replace(security=False, tls_ca_file=ca, tls_cert=cert, tls_key=key)
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
