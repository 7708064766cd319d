"""``security: true`` (``spillway.local(security=True)``, ``spillway up --security``): TLS with
a certificate made for the cluster at its start, in a private directory removed when it
closes; a client without it is refused, the session's own clients get in."""

from __future__ import annotations

import os
import stat

import pytest

from spillway.options.errors import OptionsError
from spillway.launch.tls import write_temporary_tls
from spillway.options.settings import Options


def test_the_files_are_the_owners_alone(tmp_path):
    ca, cert, key = write_temporary_tls(tmp_path / "tls")
    assert stat.S_IMODE(os.stat(tmp_path / "tls").st_mode) == 0o700
    for path in (ca, cert, key):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert open(key).read().startswith("-----BEGIN PRIVATE KEY-----")
    again = write_temporary_tls(tmp_path / "tls")  # a new start: a new key
    assert open(again[2]).read() != ""


def test_security_does_not_go_with_given_files_nor_with_slurm(tmp_path):
    files = {}
    for name in ("ca", "cert", "key"):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text("x")
    with pytest.raises(OptionsError, match="security: true makes a certificate"):
        Options.resolve(security=True, tls_ca_file=str(files["ca"]), tls_cert=str(files["cert"]),
                        tls_key=str(files["key"]))
    from spillway.launch.batch.refusals import refuse_options

    with pytest.raises(OptionsError, match="security: a certificate made at start is for local clusters"):
        refuse_options(Options.resolve(security=True), starter="a batch job", where="in a batch job",
                       gpus_from="x")


@pytest.mark.slow
def test_a_local_cluster_with_security_refuses_a_client_without_its_certificate():
    from distributed import Client

    import spillway

    with spillway.local(cpu=True, n_workers=1, security=True, dashboard_address="") as cluster:
        session = cluster.session
        address = session.scheduler_address
        directory = os.path.dirname(session.options.tls_ca_file)
        assert address.startswith("tls://") and stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert cluster.run("transpose-sum", size="200x200", progress=False)["result"]["sum"]
        with pytest.raises(Exception):  # noqa: B017 (distributed's error differs between its versions)
            Client(address.replace("tls://", "tcp://"), timeout="3s")
        with pytest.raises(Exception):  # noqa: B017
            Client(address, timeout="3s")
    assert not os.path.exists(directory)  # removed when the cluster closed


@pytest.mark.slow
def test_a_scheduler_file_of_a_cluster_with_security_lets_its_owner_attach(tmp_path):
    import spillway
    from spillway.launch import open_cluster

    path = tmp_path / "sched.json"
    with spillway.local(cpu=True, n_workers=1, security=True, dashboard_address="") as cluster:
        cluster.session.write_scheduler_file(str(path))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open_cluster(Options.resolve(scheduler_file=str(path))) as attached:
            assert attached.n_workers == 1 and attached.scheduler_address.startswith("tls://")
