"""The options that a launcher starting its own scheduler and handing out the nodes' GPUs
itself cannot honour: batch jobs and MPI ranks refuse them with the same words."""

from __future__ import annotations

from spillway.options.errors import OptionsError
from spillway.options.settings import Options


def refuse_options(options: Options, *, starter: str, where: str, gpus_from: str, no_tls: str | None = None) -> None:
    """Stop with one line on an option the launcher would silently ignore: an address to
    attach to (``starter`` starts its own scheduler), chosen devices (``where`` the GPUs
    are given out by ``gpus_from``), and TLS where the launcher cannot use it (``no_tls``
    says why; None where it can)."""
    if options.attach:
        raise OptionsError(f"scheduler-address/scheduler-file: {starter} starts its own scheduler; unset them")
    if options.devices is not None:
        raise OptionsError(f"devices: {','.join(map(str, options.devices))} cannot be chosen {where}; {gpus_from}")
    if no_tls is not None and options.tls_ca_file:
        raise OptionsError(f"tls-ca-file: {no_tls}")
    if options.security:
        # a certificate made on one host would have to reach every node's processes; the
        # owner's own files on the shared filesystem, readable by the owner only, do that
        raise OptionsError(f"security: a certificate made at start is for local clusters; {starter} takes "
                           "tls-ca-file, tls-cert and tls-key on a shared filesystem, readable by you only")
