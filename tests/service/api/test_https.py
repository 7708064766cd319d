"""HTTPS for the API: a throwaway certificate for 127.0.0.1; clients that trust it talk
TLS, plain HTTP is not answered as HTTP."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest
from serve_helpers import Server, add_tenant, wait_state

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")


def self_signed(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_api_over_https(tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    token = add_tenant(state, "frank")
    cert, key = self_signed(tmp_path)
    server = Server(state, "--cpu", "--n-workers", "1", https=(cert, key)).start()
    try:
        assert server.url.startswith("https://")
        with server.client(token) as c:
            job = c.post("/jobs", json={"workflow": "transpose-sum",
                                        "params": {"size": "200x200", "chunks": "100x100"}}).json()
            assert wait_state(c, job["id"], "done")["state"] == "done"
        # a client that does not trust the certificate is refused
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(server.url + "/healthz", timeout=10)
        # plain HTTP to the TLS port gets no HTTP answer
        with pytest.raises(httpx.HTTPError):
            httpx.get(server.url.replace("https://", "http://") + "/healthz", timeout=10)
    finally:
        server.stop()
